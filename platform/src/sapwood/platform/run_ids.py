"""The one rule for run ids, applied by the API, the recorder SDK and ingest (an event's validation).

Ids outside it were once recorded by producers, listed, and then could not be opened at
``/v1/runs/{run_id}`` (a ``/`` splits the path; over 128 characters the API refuses them).
"""

from __future__ import annotations

import re

from sapwood.platform.errors import ValidationError

#: Run ids: 1-128 characters of ``A-Z a-z 0-9 . _ : @ -``, starting with a letter or digit. No ``/``
#: (an id must be one URL path segment: ``/v1/runs/{run_id}`` and ``/v1/runs/{run_id}/items``).
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
_RUN_ID_RE = re.compile(RUN_ID_PATTERN)


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is in the safe alphabet (:data:`RUN_ID_PATTERN`), else :class:`ValidationError`."""
    if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id):
        raise ValidationError(f"run id {run_id!r:.140} must be 1-128 characters of A-Z a-z 0-9 . _ : @ - "
                              "starting with a letter or digit")
    return run_id
