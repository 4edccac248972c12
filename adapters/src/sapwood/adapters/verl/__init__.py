"""Sapwood inside verl (extra ``verl``): record verl's agent loops, train verl on Sapwood's history.

- :mod:`.rows`: a learner batch (:class:`~sapwood.learner.batch.TreeBatch`) as verl-shaped trajectory rows
  (pure torch, no verl import);
- :mod:`.data_proto`: those rows as verl's ``DataProto`` (prompt/response padding, what was cut);
- :mod:`.replay`: batches of a Sapwood replay run in a fixed order with a resumable cursor, for verl's
  stateful data loader (exactly once across a verl restart);
- :mod:`.prompts`: verl-style Parquet datasets in and out of a run's prompt queue;
- :mod:`.agent_loop`: the ``sapwood`` agent loop that records another registered loop's calls.

Only :mod:`.data_proto` and :mod:`.agent_loop` import verl; the rest of Sapwood never does.
"""
