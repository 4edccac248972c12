"""Adapters that put Sapwood inside other training frameworks (each behind its own extra)."""
