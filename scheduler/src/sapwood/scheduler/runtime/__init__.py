"""Elastic runtime on Ray: cells as actors that change role without losing a call or resetting an
environment (:mod:`.cell`, :mod:`.router`, :mod:`.switch`; executions in their own actors are the
demo's, :mod:`sapwood.demo.elastic.executions`), the store writer
(:mod:`.store_writer`), the scheduler's Ray actuator (:mod:`.actuator`), core/satellite learners
over torch.distributed (:mod:`.learners`) and the SGLang switch hooks (:mod:`.sglang_hooks`).

Ray is the ``ray`` extra; importing this package's modules needs it.
"""
