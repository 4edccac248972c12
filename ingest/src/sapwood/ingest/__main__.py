"""``python -m sapwood.ingest [options]``: same as ``sapwood ingest``."""

from sapwood.ingest.cli import main

main()
