"""sapwood.ingest"""
