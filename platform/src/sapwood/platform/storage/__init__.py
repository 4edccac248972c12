"""Storage interfaces, one per concern: with the schema, the only code that knows tables and dialects.

The four interfaces (a protocol and a factory each; one implementation per dialect under
:mod:`.sqlite` and :mod:`.postgres`, cached where stateless):

- :mod:`.recorder` — the event recorder: apply a batch of events (the planner in
  ``sapwood.platform.planner`` plans, the recorder reads stored state and writes);
  :func:`.recorders.event_recorder`;
- :mod:`.trees` — the tree reader: contexts, logical paths, subtrees, token pages, batch rows;
  :func:`.trees.tree_reader`;
- :mod:`.runs` — the run queue: claim, renew, complete, release, replay snapshots;
  :func:`.runs.run_queue`;
- :mod:`.offsets` — the ingest's per-partition offsets, advanced by compare-and-set;
  :func:`.offsets.offset_store`.

Smaller reads and writes beside them: :mod:`.executions`, :mod:`.calls`, :mod:`.cells`,
:mod:`.scheduler_signals`, :mod:`.learner_reads`, :mod:`.store_stats`, :mod:`.deadletters`,
:mod:`.api_keys`, :mod:`.transactions`; :mod:`.dialects` picks an implementation for a backend.
One contract suite per interface (``tests/platform/storage/``) runs against SQLite and PostgreSQL.
This package imports nothing on purpose (its modules are imported by full path), so importing one
interface does not load the others.
"""
