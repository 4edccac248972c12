"""PostgreSQL implementations of the storage interfaces (production)."""
