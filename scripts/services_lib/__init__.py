"""The parts of ``scripts/services.py`` (standard library only): state, processes, PostgreSQL, Kafka."""
