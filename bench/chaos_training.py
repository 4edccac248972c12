"""Training chaos campaign: kill -9 rollout workers, ingest, learners and the live scheduler of a real run,
then prove from the store that every prompt sample was rolled out once and every finished execution trained
exactly once, and compare the evaluation reward with a no-fault run (``sapwood.demo.chaos.campaign``).

    python bench/chaos_training.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres \\
        [--prompts 200] [--samples 2] [--workers 3] [--learners 2] [--kills 30] [--out DIR] \\
        [--kafka BOOTSTRAP --ingests 2] [--no-scheduler] [--no-compare]

The same as ``sapwood chaos training``. The last stdout line is one JSON object.
"""

from __future__ import annotations

import sys

from sapwood.demo.chaos.campaign import run_campaign
from sapwood.platform.cli import main as sapwood

__all__ = ["run_campaign"]

if __name__ == "__main__":
    sys.argv = ["sapwood", "chaos", "training", *sys.argv[1:]]
    sapwood()
