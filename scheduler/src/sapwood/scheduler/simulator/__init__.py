"""Discrete-event cluster simulator (SimPy) driving the scheduler's policies through the live Signals type."""

from sapwood.scheduler.simulator.cluster import ClusterSim, simulate
from sapwood.scheduler.simulator.results import SimResult
from sapwood.scheduler.simulator.workload import PRESETS, Workload, preset

__all__ = ["PRESETS", "ClusterSim", "SimResult", "Workload", "preset", "simulate"]
