"""Storage interfaces, one per concern: with the schema, the only code that knows tables and dialects.

The interfaces (a protocol each, one implementation per dialect under :mod:`.sqlite` and
:mod:`.postgres`; every factory is in :mod:`.backends`, the only module that imports the
implementations, so no interface module depends on a dialect's):

- :mod:`.applier` — the event applier: the stored state the planner reads (its ports in
  ``sapwood.platform.planner.ports``) and the write of its plan; :func:`.backends.event_applier`;
- :mod:`.trees` — the tree reader: contexts, logical paths, subtrees, token pages, batch rows;
  :func:`.backends.tree_reader`;
- :mod:`.runs` — the run queue: claim, renew, complete, release, replay snapshots;
  :func:`.backends.run_queue`;
- :mod:`.offsets` — the ingest's per-partition offsets, advanced by compare-and-set;
  :func:`.backends.offset_store`;
- :mod:`.api_keys` and :mod:`.transactions`: :func:`.backends.api_key_store`, :func:`.backends.transactions`.

Smaller reads and writes beside them: :mod:`.executions`, :mod:`.calls`, :mod:`.cells`,
:mod:`.scheduler_signals`, :mod:`.learner_reads`, :mod:`.store_stats`, :mod:`.drift`, :mod:`.deadletters`,
:mod:`.dialects` picks an implementation for a backend.
One contract suite per interface (``tests/platform/storage/``) runs against SQLite and PostgreSQL.
This package imports nothing on purpose (its modules are imported by full path), so importing one
interface does not load the others.
"""
