"""The training chaos campaign (``sapwood chaos training``, ``bench/chaos_training.py``): kill -9 every process
kind of a real run, then prove from the store that nothing was skipped, duplicated or left untrained."""
