"""Four processes starting at once on an empty PostgreSQL database all migrate it, and all succeed:
the first holds the migration lock while it upgrades, the others wait for it and find the schema at head."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from sapwood.platform.store import Store

FIRST_START = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    go = Path(sys.argv[2])
    while not go.exists():  # every process imported everything: start the upgrade at one moment
        time.sleep(0.01)
    from sapwood.platform.store import Store
    Store.open(sys.argv[1]).close()
    """
)


def test_four_processes_migrating_an_empty_database_at_once_all_succeed(pg_url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, "-c", FIRST_START, pg_url, str(go)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(4)]
    go.touch()
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    codes = [p.returncode for p in procs]
    assert codes == [0, 0, 0, 0], "\n---\n".join(outputs)
    store = Store.open(pg_url, migrate=False)
    try:
        assert store.current_revision() == _head_revision()
    finally:
        store.close()


def _head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from sapwood.platform.store import migrations_dir

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head
