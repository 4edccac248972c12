"""Storage interfaces, one per concern; the only code besides the schema that knows tables and dialects.

- ``recorder`` — the event recorder: apply a batch of events (plan, then write);
- ``trees`` — the tree reader: contexts, logical paths and subtrees of stored executions;
- ``runs`` — the run queue: claim, renew, complete and release executions, replay snapshots;
- ``offsets`` — the offset store: the ingest's per-partition offsets, advanced by compare-and-set.

Each concern has a protocol here and one implementation per dialect under :mod:`.sqlite` and
:mod:`.postgres`; one contract suite (``tests/platform/storage/``) runs against both.
"""
