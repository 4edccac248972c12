"""Request and response models of the HTTP API (they are also its OpenAPI schema)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from typing_extensions import TypeAliasType

from sapwood.platform.errors import ValidationError
from sapwood.platform.execution_filter import (
    JSON_INT_MAX,
    JSON_INT_MIN,
    JSON_NUMBER_MAX,
    JSON_NUMBER_MIN,
    ExecutionFilter,
    JsonNumber,
    NonNegativeInt32,
)
from sapwood.platform.json_values import check_json_numbers
from sapwood.platform.run_ids import RUN_ID_PATTERN
from sapwood.platform.runs import CONFIG_MAX_BYTES, CONFIG_MAX_DEPTH, check_storable_json

RoleName = Literal["prompt", "observation", "action", "summary"]
#: Text without NUL characters (PostgreSQL text and JSONB cannot hold them).
NO_NUL = r"^[^\x00]*$"
ShortText = Annotated[str, StringConstraints(max_length=128, pattern=NO_NUL)]
RunId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=RUN_ID_PATTERN)]
FiniteFloat = Annotated[JsonNumber, Field(allow_inf_nan=False, ge=JSON_NUMBER_MIN, le=JSON_NUMBER_MAX)]
INT32_MAX = 2**31 - 1


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- errors --------------------------------------------------------------------------------------------
class ErrorDetail(_Out):
    code: str = Field(description="machine-readable error code, e.g. not_found, invalid_request, forbidden")
    message: str = Field(description="what was wrong and what was expected")
    details: list[dict[str, Any]] | None = Field(default=None, description="per-field problems (422 only)")


class ErrorOut(_Out):
    error: ErrorDetail


# -- executions and runs --------------------------------------------------------------------------------
class _TrainedReward(_Out):
    """The reward the learner trains on and the raw values it was resolved from."""

    reward: float | None = Field(description="the reward the learner trains on (one rule, sapwood.platform.tree, "
                                             "default policy); null: left out of training (error or running)")
    final_reward: float | None = Field(description="the recorded final reward, as the execution reported it")
    latest_score: float | None = Field(description="the latest partial score")
    reward_source: str | None = Field(description="where `reward` came from: leaf / final / partial_score / "
                                                  "missing / zero: timeout / excluded: error / excluded: running")


class ExecutionOut(_TrainedReward):
    execution_id: str
    run_id: str
    task_id: str
    task_family: str
    engine: str
    sampling_params: dict[str, Any]
    vocab_size: int | None
    metadata: dict[str, Any]
    status: str = Field(description="running / success / timeout / error")
    leaf_rewards: dict[str, float]
    message: str
    started_at: float = Field(description="unix seconds")
    finished_at: float | None
    last_seq: int = Field(description="sequence number of the execution's latest event (its version)")
    n_nodes: int
    n_tokens: int = Field(description="tokens in the tree, shared prefixes counted once")
    n_input_tokens: int = Field(description="sum of the model calls' input lengths")
    n_output_tokens: int
    n_calls: int
    n_forks: int
    n_segments: int
    max_policy_version: int | None
    score: float | None = Field(description="latest partial score")
    score_revision: int | None


class ExecutionPage(_Out):
    items: list[ExecutionOut]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last page")


class RunProgress(_Out):
    pending: int
    claimed: int
    done: int
    total: int


class RunOut(_Out):
    run_id: str
    kind: str | None = Field(description="replay / live for training runs; null when the id only names recorded "
                                         "executions (a rollout run)")
    filter: dict[str, Any] | None
    seed: int | None
    config: dict[str, Any] | None
    description: str | None
    created_at: float | None
    progress: RunProgress | None = Field(description="queue of a training run (null for rollout-only ids)")
    executions: dict[str, int] = Field(description="executions recorded under this run id, by status")


class RunPage(_Out):
    items: list[RunOut]
    next_cursor: str | None


NoNulText = Annotated[str, StringConstraints(pattern=NO_NUL)]


def _keys_without_nul(value: dict[str, Any]) -> dict[str, Any]:
    if any("\x00" in k for k in value):
        raise ValueError("object keys must not contain NUL characters")
    return value


#: An object whose keys have no NUL (``propertyNames`` in the schema; pydantic would write a key pattern
#: as ``patternProperties``, which lets other keys through as additional properties).
_NO_NUL_KEYS = Field(json_schema_extra={"propertyNames": {"pattern": NO_NUL}})
#: A JSON value the store can hold and read back (text without NUL, numbers that are IEEE-754 doubles
#: exactly: integers within ±2**53 stay integers, larger exact ones are read as floats); a run's
#: config is an object of them. Depth, size and lone surrogates are checked after parsing.
if TYPE_CHECKING:  # mypy cannot follow a recursive TypeAliasType
    JsonValue = Any
else:
    JsonValue = TypeAliasType("JsonValue", Union[  # noqa: UP007 (a recursive alias needs the Union form)
        NoNulText,
        Annotated[int, Field(ge=JSON_INT_MIN, le=JSON_INT_MAX)],
        FiniteFloat,
        bool,
        list["JsonValue"],
        Annotated[dict[str, "JsonValue"], _NO_NUL_KEYS, AfterValidator(_keys_without_nul)],
        None,
    ])
RunConfig = Annotated[dict[str, JsonValue], _NO_NUL_KEYS, AfterValidator(_keys_without_nul), Field(description=(
    f"free-form run configuration (JSON object): at most {CONFIG_MAX_DEPTH} levels deep and {CONFIG_MAX_BYTES} "
    "bytes of JSON, text without NUL or lone surrogates, numbers that are IEEE-754 doubles exactly "
    "(NaN, Infinity and integers a double would round are refused)"))]


class RunCreate(BaseModel):
    """A new training run over historical executions."""

    model_config = ConfigDict(extra="forbid")

    run_id: RunId | None = Field(default=None, description="id of the new run (1-128 of A-Z a-z 0-9 . _ : @ -, "
                                                             "starting with a letter or digit); generated when omitted")
    kind: Literal["replay", "live"] = Field(
        default="replay",
        description="replay: snapshot the finished executions matching the filter, in a seed-fixed order; "
                    "live: keep following newly finished matching executions",
    )
    filter: ExecutionFilter = Field(default_factory=ExecutionFilter)
    seed: NonNegativeInt32 = Field(default=0, description="fixes the order of a replay run")
    description: Annotated[str, StringConstraints(max_length=2000, pattern=NO_NUL)] = ""
    config: RunConfig = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _config_numbers(cls, data: Any) -> Any:
        """Numbers a double does not hold get one message naming their path (not a union's errors)."""
        if isinstance(data, dict) and isinstance(data.get("config"), dict):
            try:
                check_json_numbers(data["config"], "config", max_depth=CONFIG_MAX_DEPTH)
            except ValidationError as exc:
                raise ValueError(str(exc)) from None
        return data

    @model_validator(mode="after")
    def _storable(self) -> RunCreate:
        for name in ("min_policy_version", "max_policy_version"):
            value = getattr(self.filter, name)
            if value is not None and value > INT32_MAX:
                raise ValueError(f"filter.{name}: at most {INT32_MAX}")
        try:  # everything the store will hold must read back: checked before anything is written
            check_storable_json(self.config, "config")
            check_storable_json(self.filter.model_dump(), "filter")
        except ValidationError as exc:
            raise ValueError(str(exc)) from None
        return self


class RunCreated(RunOut):
    queued: int = Field(description="executions queued for the run when it was created")


class RunItemOut(_Out):
    position: int = Field(description="0-based place in the run's order")
    execution_id: str
    order_key: int
    state: str = Field(description="pending / claimed / done")
    claimed_by: str | None
    attempts: int
    done_at: float | None


class RunItemsPage(_Out):
    run_id: str
    items: list[RunItemOut]
    next_cursor: str | None


# -- trees ----------------------------------------------------------------------------------------------
class NodeOut(_Out):
    node_id: str
    parent_id: str | None = Field(description="previous node of the same context (null for a segment root)")
    prev_segment_node: str | None = Field(description="for a segment root: the summary node it continues")
    role: RoleName
    length: int = Field(description="tokens in this node")
    depth: int = Field(description="token offset of the node's first token in its context")
    level: int = Field(description="tree level: 0 for the first root; a segment root is one below its summary")
    segment: int
    is_leaf: bool
    fork_branches: int = Field(description="branches declared by a fork event at this node (0 = none)")
    n_children: int
    call_id: str | None = Field(description="model call that produced this node (actions and summaries)")
    policy_version: int | None
    seq: int = Field(description="sequence number of the event that created the node")


class SegmentOut(_Out):
    segment: int
    root_node: str
    from_node: str | None = Field(description="summary node the segment continues (null for segment 0)")
    seq: int


class ScoreOut(_Out):
    event_id: str
    revision: int
    score: float
    components: dict[str, float]
    scorer: str
    note: str
    created_at: float


class TreeLimits(_Out):
    max_nodes: int
    max_level: int | None


class TreeOut(_Out):
    execution: ExecutionOut
    nodes: list[NodeOut] = Field(description="in creation order: every parent precedes its children")
    segments: list[SegmentOut]
    scores: list[ScoreOut]
    fork_points: list[str] = Field(description="nodes with a fork event or more than one child")
    leaves: list[str]
    n_nodes_total: int
    truncated: bool = Field(description="true when limits dropped nodes (see /tree/summary for huge trees)")
    limits: TreeLimits


class SummaryNode(NodeOut):
    kinds: list[Literal["root", "segment_root", "fork", "leaf", "compacted"]] = Field(
        description="why the node is kept in the summary"
    )


class SummaryEdge(_Out):
    parent: str = Field(description="upper kept node")
    child: str = Field(description="lower kept node")
    kind: Literal["chain", "segment"] = Field(description="chain: collapsed nodes of one context; segment: a "
                                                          "compaction boundary (summary → next segment root)")
    n_nodes: int = Field(description="collapsed nodes strictly between parent and child")
    n_tokens: int
    n_calls: int = Field(description="model calls whose outputs are among the collapsed nodes")
    tokens_by_role: dict[str, int]


class TreeSummaryOut(_Out):
    execution: ExecutionOut
    nodes: list[SummaryNode] = Field(description="roots, fork points, compacted summaries and leaves")
    edges: list[SummaryEdge]
    segments: list[SegmentOut]
    scores: list[ScoreOut]
    n_nodes_total: int


class TrajectoryInfo(_TrainedReward):
    leaf_node_id: str
    segment: int
    n_segments: int
    n_tokens: int = Field(description="tokens of the logical trajectory: all its segments' contexts")
    n_trainable: int = Field(description="action and summary tokens")


class TrajectoryList(_Out):
    execution_id: str
    items: list[TrajectoryInfo]


class PathNode(_Out):
    node_id: str
    role: RoleName
    segment: int
    offset: int = Field(description="offset of the node's first token in the logical trajectory")
    depth: int = Field(description="offset of the node's first token in its segment's context")
    length: int
    call_id: str | None
    policy_version: int | None


class TrajectorySegment(_Out):
    segment: int
    root_node: str
    from_node: str | None
    offset: int = Field(description="offset of the segment's first token in the logical trajectory")
    n_tokens: int


class TokenPiece(_Out):
    node_id: str
    role: RoleName
    segment: int
    offset: int = Field(description="offset of token_ids[0] in the logical trajectory")
    token_ids: list[int]
    logprobs: list[float] | None = Field(description="rollout log-probs (actions and summaries only)")
    call_id: str | None
    policy_version: int | None


class TrajectoryOut(_TrainedReward):
    execution_id: str
    leaf_node_id: str
    is_leaf: bool
    n_tokens: int
    offset: int
    limit: int
    next_offset: int | None = Field(description="offset of the next token page; null after the last token")
    segments: list[TrajectorySegment]
    nodes: list[PathNode] = Field(description="the whole root-to-leaf path across segments")
    pieces: list[TokenPiece] = Field(description="tokens in [offset, offset+limit), split at node boundaries")


class NodeDetail(NodeOut):
    execution_id: str
    offset: int
    limit: int
    next_offset: int | None
    token_ids: list[int] = Field(description="the node's tokens in [offset, offset+limit)")
    logprobs: list[float] | None
    text: str | None = Field(description="decoded tokens when a tokenizer is configured")
    token_texts: list[str] | None = Field(default=None, description="each token decoded on its own "
                                                                     "(when a tokenizer is configured)")


# -- calls and audit ------------------------------------------------------------------------------------
class CallOut(_Out):
    call_id: str
    execution_id: str
    seq: int
    call_kind: str
    segment: int
    policy_version: int
    input_node: str
    input_len: int
    output_node: str
    n_output: int
    finish_reason: str
    created_at: float


class CallPage(_Out):
    items: list[CallOut]
    next_cursor: str | None


class NodeCallsOut(_Out):
    node_id: str
    token_start: int = Field(description="offset of the node's first token in each of these calls' inputs")
    token_end: int
    items: list[CallOut] = Field(description="calls whose exact input contains the node, in event order")
    next_cursor: str | None


class AuditPathNode(_Out):
    node_id: str
    role: RoleName
    depth: int
    length: int
    call_id: str | None
    policy_version: int | None


class AuditInput(_Out):
    node_id: str = Field(description="last node of the input path")
    length: int
    recorded_digest: str = Field(description="BLAKE2b-128 hex the producer sent")
    computed_digest: str = Field(description="BLAKE2b-128 hex of the tokens rebuilt from the tree")
    verified: bool
    token_ids: list[int] | None
    text: str | None
    path: list[AuditPathNode]


class AuditOutput(_Out):
    node_id: str
    length: int
    token_ids: list[int] | None
    logprobs: list[float] | None
    text: str | None
    token_texts: list[str] | None = Field(default=None, description="each output token decoded on its own "
                                                                     "(when a tokenizer is configured)")


class AuditOut(_Out):
    call: CallOut
    run_id: str
    task_id: str
    engine: str
    sampling_params: dict[str, Any] = Field(description="the call's sampling params, else the execution's")
    timings: dict[str, Any]
    verified: bool = Field(description="the rebuilt input has the recorded length and digest")
    input: AuditInput
    output: AuditOutput


# -- scores, stats, keys --------------------------------------------------------------------------------
class ScoreCreate(BaseModel):
    """A new partial-score revision for an execution."""

    model_config = ConfigDict(extra="forbid")

    score: FiniteFloat
    components: Annotated[dict[ShortText, FiniteFloat], WithJsonSchema({
        "type": "object", "maxProperties": 100, "propertyNames": {"maxLength": 128, "pattern": NO_NUL},
        "additionalProperties": {"type": "number", "minimum": JSON_NUMBER_MIN, "maximum": JSON_NUMBER_MAX}})] = Field(
        default_factory=dict, max_length=100)
    scorer: ShortText = "api"
    note: Annotated[str, StringConstraints(max_length=4000, pattern=NO_NUL)] = ""
    expected_revision: NonNegativeInt32 | None = Field(
        default=None,
        description="optimistic concurrency: fail with 409 unless this is the next revision number",
    )


class LagPartition(_Out):
    group_id: str
    topic: str
    partition: int
    next_offset: int
    end_offset: int
    lag: int


class StatsOut(_Out):
    events: int
    executions: dict[str, int]
    calls: int
    nodes: int
    fork_points: int
    compactions: int
    naive_tokens: int = Field(description="tokens a store of per-call copies would hold (inputs + outputs)")
    tree_tokens: int = Field(description="tokens in the trees (shared prefixes once per execution)")
    unique_tokens: int = Field(description="tokens in distinct spans (identical content stored once)")
    dedup_ratio: float | None = Field(description="naive_tokens / tree_tokens")
    span_dedup_ratio: float | None = Field(description="tree_tokens / unique_tokens")
    span_rows: int
    span_bytes: int
    ingest_lag: int | None = Field(description="Kafka messages not yet in the store; null when not measurable")
    ingest_lag_partitions: list[LagPartition] | None
    ingest_lag_reason: str | None = Field(description="why ingest_lag is null")


class DriftedCallOut(_Out):
    call_id: str
    execution_id: str
    seq: int
    position: int = Field(description="index in the call's input of the first id that differs from the previous "
                                      "call's output ids")


class RunDriftOut(_Out):
    """Retokenization drift of one run's calls (``calls``: model calls recorded under the run id)."""

    run_id: str
    calls: int
    checked: int = Field(description="chat calls whose input continued the previous call's context (checked)")
    drifted: int = Field(description="checked calls whose previous output ids did not come back verbatim")
    rate: float | None = Field(description="drifted / checked; null when no call was checked")
    first_position: int | None = Field(description="smallest drift position over the run's calls; null: no drift")


class RunDriftDetail(RunDriftOut):
    drifted_calls: list[DriftedCallOut] = Field(description="the earliest recorded drifted calls (up to limit)")


class DriftTable(_Out):
    runs: list[RunDriftOut] = Field(description="every run with at least one checked call, by run id")


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=NO_NUL)]
    scopes: list[Literal["read", "write", "admin"]] = Field(min_length=1, max_length=3)

    @field_validator("scopes")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return sorted(set(v), key=("read", "write", "admin").index)


class KeyOut(_Out):
    key_id: str
    name: str
    scopes: list[str]
    created_at: float
    revoked: bool


class KeyCreated(KeyOut):
    key: str = Field(description="the full key '<key_id>.<secret>'; shown once, store it now")


class KeyList(_Out):
    items: list[KeyOut]


class Health(_Out):
    status: str
    database: str
