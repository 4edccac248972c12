"""API settings: the platform's :class:`Settings` plus the HTTP server's limits (env prefix ``SAPWOOD_``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from sapwood.platform.settings import Settings


class ApiSettings(Settings):
    """Configuration of ``sapwood serve``; every limit can be set from the environment."""

    api_host: str = Field(default="127.0.0.1", description="interface the server binds")
    api_port: int = Field(default=8000, ge=1, le=65535)
    api_workers: int = Field(default=1, ge=1, description="uvicorn worker processes")
    api_cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="origins allowed by CORS, comma-separated; empty (default) = no cross-origin access",
    )
    api_max_body_bytes: int = Field(default=1 << 20, ge=1, description="larger request bodies get 413")
    api_max_header_bytes: int = Field(default=32 * 1024, ge=1024, description="larger request headers (all of them "
                                      "together, names and values) get 431")
    api_max_header_count: int = Field(default=100, ge=1, description="more request headers get 431 (enforced "
                                      "while reading, with SAPWOOD_API_MAX_HEADER_BYTES, by sapwood serve)")
    api_request_read_timeout_s: float = Field(default=10.0, gt=0, description="seconds a connection has to send "
                                              "a whole request (head and body) once it starts one, or to start "
                                              "one after connecting; then 408 and close")
    api_keep_alive_s: int = Field(default=5, ge=1, description="seconds an idle keep-alive connection stays open")
    api_max_connections_per_client: int = Field(default=64, ge=1, description="open connections one client "
                                                "address may hold per worker; more get 503 and are closed")
    api_cursor_secret: SecretStr = Field(default=SecretStr(""), description="HMAC key signing pagination cursors; "
                                         "empty = random per process (`sapwood serve` makes one for its workers)")
    api_max_page_size: int = Field(default=1000, ge=1, le=10_000, description="largest `limit` of a list page")
    api_tree_max_nodes: int = Field(default=20_000, ge=1, description="most nodes one tree response may hold")
    api_max_token_page: int = Field(default=65_536, ge=1, description="most tokens one trajectory/node page holds")
    api_max_export_executions: int = Field(default=100_000, ge=1, description="most executions one export reads")
    api_export_memory_bytes: int = Field(default=64 << 20, ge=1 << 20, description="bytes one export may buffer "
                                         "(row groups are written at 1/8 of it; add one execution's stored arrays and "
                                         "one trajectory row, which are never split)")
    api_export_concurrency: int = Field(default=4, ge=1, description="exports one worker runs at once; more get 503")
    api_export_pool_size: int = Field(default=4, ge=1, description="PostgreSQL connections of the exports' own pool")
    api_export_statement_timeout_ms: int = Field(default=60_000, ge=1, description="statement timeout of exports")
    api_export_idle_timeout_s: float = Field(default=60.0, gt=0, description="PostgreSQL idle-in-transaction "
                                             "timeout of export connections")
    api_export_send_timeout_s: float = Field(default=30.0, gt=0, description="seconds a client has to take each "
                                             "chunk of an export; then it is dropped and its slot freed")
    api_cache_bytes: int = Field(default=256 << 20, ge=0, description="bytes of immutable responses kept per worker")
    api_key_cache_s: float = Field(
        default=5.0, ge=0, description="seconds a looked-up API key is reused (revocation delay across workers)"
    )
    api_threads: int = Field(default=40, ge=1, le=1000, description="threads per worker running blocking "
                             "request work (store reads); fewer queue requests instead of sharing the GIL")
    api_db_pool_size: int = Field(default=16, ge=1, description="PostgreSQL connections each worker keeps open")
    api_db_pool_timeout_s: float = Field(default=10.0, gt=0, description="seconds a request waits for a free "
                                         "PostgreSQL connection; then 503 with Retry-After")
    api_db_ping_idle_s: float = Field(default=1.0, ge=0, description="a PostgreSQL connection idle in the pool "
                                      "longer than this (seconds) is pinged before use; 0 = ping at every checkout")
    api_db_max_overflow: int = Field(default=8, ge=0, description="extra short-lived connections under bursts")
    api_version_push: bool = Field(
        default=True, description="PostgreSQL: keep execution versions current by LISTEN/NOTIFY (cache hits need no "
                                  "query); off = query the version on every cached tree request",
    )
    api_gc_freeze: bool = Field(default=True, description="freeze the objects alive after start-up (gc.freeze): "
                                "full collections no longer walk them")
    api_gc_gen0_threshold: int = Field(default=20_000, ge=0, description="allocations between the collector's "
                                       "youngest passes (Python's default: 700; 0 = leave it)")
    api_timing: bool = Field(default=False, description="send each response's time split (queue, key check, "
                             "thread hops, pool, database, JSON, GC) as a Server-Timing header")
    api_timing_dir: str = Field(default="", description="directory where each worker appends its requests' time "
                                "splits, GC pauses and event-loop lag as JSON lines (empty = none)")
    api_docs: bool = Field(default=True, description="serve /docs and /openapi.json without a key")
    api_lag_timeout_s: float = Field(default=3.0, gt=0, description="Kafka timeout when measuring ingest lag")
    api_migrate: bool = Field(default=False, description="run migrations when the app starts (serve does it once)")
    tokenizer: str = Field(
        default="none",
        description='"none", "char" (token id = Unicode code point), "recorded" (the tokenizer each execution\'s '
                    'recording named, e.g. the gateway\'s upstream model folder), a tokenizer.json file or folder, '
                    'or a dotted path "pkg.mod:factory"',
    )

    @field_validator("api_cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [o.strip() for o in value.split(",") if o.strip()]
        return value
