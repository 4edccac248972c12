"""SQLite implementations of the storage interfaces (the embedded default)."""
