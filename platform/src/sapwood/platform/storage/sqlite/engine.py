"""The SQLite engine: one embedded file in WAL mode."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Engine

from sapwood.platform.json_values import dump_json, load_json


def sqlite_engine(url: str) -> Engine:
    """Engine on the SQLite file of ``url``: a 30 s lock wait, WAL journal, ``synchronous=NORMAL``."""
    engine = sa.create_engine(url, connect_args={"timeout": 30}, json_deserializer=load_json,
                              json_serializer=dump_json)

    @sa_event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    return engine
