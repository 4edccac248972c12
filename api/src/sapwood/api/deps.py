"""Dependencies injected into the routes as ``Annotated`` aliases (``DbDep``, ``ReadKey``, ``LimitDep``, ...)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Query, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Connection

from sapwood.api import timing
from sapwood.api.auth import MISSING_KEY, KeyVerifier, Principal
from sapwood.api.cache import ResponseCache
from sapwood.api.config import ApiSettings
from sapwood.api.cursors import Cursors
from sapwood.api.errors import AuthenticationError
from sapwood.api.export_pool import ExportPool
from sapwood.api.queries.stats import LagReader
from sapwood.api.queries.trees import PathCache
from sapwood.api.recorded_tokenizer import RecordedTokenizers
from sapwood.api.schemas import NO_NUL
from sapwood.api.tokenizer import Tokenizer
from sapwood.api.versions import VersionReader
from sapwood.platform.errors import ValidationError
from sapwood.platform.events.base import ExecutionStatus
from sapwood.platform.execution_filter import ExecutionFilter
from sapwood.platform.storage.backends import transactions
from sapwood.platform.storage.errors import translate_errors
from sapwood.platform.storage.transactions import Transactions
from sapwood.platform.store import Store


@dataclass
class Services:
    """Per-process state of the API, created once by ``create_app`` (``app.state.sapwood``)."""

    settings: ApiSettings
    store: Store
    verifier: KeyVerifier
    cache: ResponseCache
    tokenizer: Tokenizer | None
    lag: LagReader
    versions: VersionReader
    paths: PathCache
    cursors: Cursors
    exports: ExportPool
    #: ``SAPWOOD_TOKENIZER=recorded``: the tokenizer each execution's recording named (else None).
    recorded_tokenizers: RecordedTokenizers | None = None

    def tokenizer_of(self, conn: Connection, execution_id: str) -> Tokenizer | None:
        """The tokenizer for an execution's text: the configured one, else the one its recording named."""
        if self.tokenizer is not None or self.recorded_tokenizers is None:
            return self.tokenizer
        return self.recorded_tokenizers.for_execution(conn, execution_id)

    @functools.cached_property
    def modes(self) -> Transactions:
        """How this store's backend gives snapshot reads and serialized writes."""
        return transactions(self.store.engine)

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        """A connection for reads whose statements each stand alone; driver errors are translated.

        No transaction (autocommit on PostgreSQL): an audit's two statements are two round trips, not
        four with ``BEGIN`` and ``COMMIT``, and psycopg keeps its prepared statements (it drops them on
        a rollback). For reads of immutable rows (calls, spans, paths) or of one row in one statement;
        reads that must agree with each other use :meth:`snapshot`.
        """
        with translate_errors(), self._connect() as conn:
            yield self.modes.statement_reads(conn)

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """A connection for reads whose statements all see one snapshot (REPEATABLE READ on PostgreSQL)."""
        with translate_errors(), self._connect() as conn:
            yield self.modes.snapshot(conn)
            conn.commit()  # see read()

    def _connect(self) -> Connection:
        """A pooled connection (the wait for it is the request's ``pool`` time, see :mod:`sapwood.api.timing`)."""
        with timing.phase("pool"):
            return self.store.engine.connect()

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        """A transaction, committed on success.

        On SQLite it starts with ``BEGIN IMMEDIATE``: the write lock is taken before the first read,
        so read-then-write transactions (next score revision, last admin key) are serialized across
        threads and worker processes, as row locks serialize them on PostgreSQL.
        """
        with translate_errors(), self.store.engine.begin() as conn:
            self.modes.begin_write(conn)
            yield conn


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.sapwood
    return services


ServicesDep = Annotated[Services, Depends(get_services)]

_bearer = HTTPBearer(auto_error=False, scheme_name="bearer",
                     description="`Authorization: Bearer <key_id>.<secret>` (from `sapwood keys create`)")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, scheme_name="apiKey",
                        description="`X-API-Key: <key_id>.<secret>`")


class RequireScope:
    """Dependency: the caller's API key, which must hold ``scope`` (401 without a valid key, 403 without it)."""

    def __init__(self, scope: Literal["read", "write", "admin"]) -> None:
        self.scope = scope

    async def __call__(
        self,
        request: Request,
        bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        api_key: Annotated[str | None, Depends(_api_key)],
    ) -> Principal:
        raw = bearer.credentials if bearer is not None else api_key
        if not raw:
            raise AuthenticationError(MISSING_KEY)
        verifier: KeyVerifier = request.app.state.sapwood.verifier
        with timing.phase("key"):
            key_id, secret, record = await verifier.record_of(raw)
            return verifier.check(record, key_id, secret, self.scope)


ReadKey = Annotated[Principal, Depends(RequireScope("read"))]
WriteKey = Annotated[Principal, Depends(RequireScope("write"))]
AdminKey = Annotated[Principal, Depends(RequireScope("admin"))]


async def page_limit(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=10_000, description="page size (at most SAPWOOD_API_MAX_PAGE_SIZE)")] = 100,
) -> int:
    settings: ApiSettings = request.app.state.sapwood.settings
    if limit > settings.api_max_page_size:
        raise ValidationError(f"limit {limit} is above the largest page size {settings.api_max_page_size}")
    return limit


LimitDep = Annotated[int, Depends(page_limit)]
CursorQuery = Annotated[str | None, Query(max_length=512, pattern=r"^[A-Za-z0-9_-]*$",
                                          description="next_cursor of the previous page")]
Text = Annotated[str | None, Query(max_length=256, pattern=NO_NUL)]
Version = Annotated[int | None, Query(ge=0, le=2**31 - 1)]
Seconds = Annotated[float | None, Query(allow_inf_nan=False, description="unix seconds")]
Score = Annotated[float | None, Query(allow_inf_nan=False)]
Status = ExecutionStatus


async def execution_filter(
    run_id: Text = None,
    task_id: Text = None,
    task_family: Text = None,
    status: Annotated[list[Status] | None, Query(description="repeat for several")] = None,
    min_policy_version: Version = None,
    max_policy_version: Version = None,
    min_score: Score = None,
    max_score: Score = None,
    started_after: Seconds = None,
    started_before: Seconds = None,
) -> ExecutionFilter:
    """The ExecutionFilter given as query parameters (score = reward, or the partial score if unrewarded)."""
    return ExecutionFilter(run_id=run_id, task_id=task_id, task_family=task_family, status=status,
                           min_policy_version=min_policy_version, max_policy_version=max_policy_version,
                           min_score=min_score, max_score=max_score, started_after=started_after,
                           started_before=started_before)


FilterDep = Annotated[ExecutionFilter, Depends(execution_filter)]
