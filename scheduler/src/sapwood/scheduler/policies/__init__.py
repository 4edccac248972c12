"""Built-in scheduling policies: the elastic default and the Colocate / Async baselines."""

from sapwood.scheduler.policies.colocate import ColocatePolicy
from sapwood.scheduler.policies.elastic import ElasticPolicy
from sapwood.scheduler.policies.static import AsyncPolicy

__all__ = ["AsyncPolicy", "ColocatePolicy", "ElasticPolicy"]
