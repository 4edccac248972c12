"""``verl_suite/`` imports the real verl and runs inside verl's own venv (``test_verl_suite.py`` starts it)."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("verl") is not None else ["verl_suite"]
