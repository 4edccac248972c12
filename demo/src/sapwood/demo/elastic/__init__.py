"""``sapwood demo --elastic``: the demo on the scheduler's elastic Ray runtime (extras ``demo`` and ``ray``).

:mod:`.executions` plays key-recall executions on a few execution hosts (agent loops and environments
outside the cells) through the runtime's router; :mod:`.driver` runs every schedule on the same
seeds; :mod:`.workload` draws the per-batch long-tail length scales; :mod:`.plots` draws the role
timelines; :mod:`.cli` is the ``--elastic`` branch of the command.
The runtime itself (cells, router, switch protocol, store writer) is :mod:`sapwood.scheduler.runtime`.
"""
