"""The apply planner: turns a batch of events plus the stored state into a typed plan, dialect-free.

- :mod:`.batch` — :class:`~.batch.BatchPlanner`: validates each event in order against the stored
  state and the batch's earlier effects, and hands the rows to write as
  :class:`~sapwood.platform.planner.ports.PlannedWrites`;
- :mod:`.handlers` — one typed handler per event class (``functools.singledispatch``);
- :mod:`.tree_effects` — new nodes, node updates, prefix-hash states and full-input matching;
- :mod:`.span_effects` — the batch's spans, their digests and figures;
- :mod:`.executions` — per-execution order, status and counters;
- :mod:`.cells` — the scheduler's cell events;
- :mod:`.run` — :func:`~.run.apply_batch`: duplicates, planning and the phase timings around a
  applier's write;
- :mod:`.results` — what apply returns, and the context cache.

Every read of the store goes through a :class:`~sapwood.platform.planner.ports.StoredState`;
the SQL behind it, and every write, belong to the storage appliers.
"""
