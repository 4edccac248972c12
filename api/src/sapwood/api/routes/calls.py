"""Audit of model calls: which exact context produced which output."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from sapwood.api.cache import Cached
from sapwood.api.deps import ReadKey, ServicesDep
from sapwood.api.queries import audit as q
from sapwood.api.routes import AUTH_ERRORS, NOT_FOUND, cached, cached_json, dump
from sapwood.api.schemas import AuditOut
from sapwood.platform.span_encoding import decode_span

router = APIRouter(prefix="/v1/calls", tags=["audit"], responses=AUTH_ERRORS)


@router.get("/{call_id}/audit", response_model=AuditOut, responses={**NOT_FOUND})
async def audit_call(
    call_id: uuid.UUID,
    request: Request,
    services: ServicesDep,
    _key: ReadKey,
    tokens: Annotated[bool, Query(description="include input/output token ids and log-probs")] = True,
    text: Annotated[bool, Query(description="include decoded text (when SAPWOOD_TOKENIZER is set)")] = True,
) -> Response:
    """The exact input of a model call, rebuilt from the tree and verified against the digest the producer
    recorded (BLAKE2b-128 over packed int32), with its policy version, engine, sampling params, timings,
    output tokens and rollout log-probs. ``verified`` is false if the rebuilt input differs in length or digest.

    Calls and spans are immutable, so audits are cached per worker (``X-Sapwood-Cache``) and carry an ETag.
    """
    cid = str(call_id)

    def build() -> bytes:
        with services.read() as conn:
            return dump(AuditOut, q.audit(conn, cid, tokenizer=services.tokenizer, tokens=tokens, text=text,
                                         tokenizer_of=services.tokenizer_of))

    return await cached_json(request, services, ("audit", cid, tokens, text), build)


@router.get(
    "/{call_id}/input.bin",
    response_class=Response,
    responses={**NOT_FOUND, 200: {"description": "packed little-endian int32 token ids of the exact input",
                                  "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                      "format": "binary"}}}}},
)
async def call_input_binary(call_id: uuid.UUID, services: ServicesDep, _key: ReadKey) -> Response:
    """The exact input as packed little-endian int32 (4 bytes per token), with the verification in headers:
    ``X-Sapwood-Recorded-Digest``, ``X-Sapwood-Computed-Digest``, ``X-Sapwood-Verified``."""
    cid = str(call_id)

    def build() -> Cached:
        with services.read() as conn:
            _, rebuilt = q.call_with_input(conn, cid)
        return rebuilt.token_ids.tobytes(), {
            "X-Sapwood-Recorded-Digest": rebuilt.recorded_digest,
            "X-Sapwood-Computed-Digest": rebuilt.computed_digest,
            "X-Sapwood-Verified": "true" if rebuilt.verified else "false",
            "X-Sapwood-Token-Count": str(rebuilt.token_ids.size),
        }

    hit, state = await cached(services, ("input.bin", cid), build)
    return Response(hit[0], media_type="application/octet-stream", headers={**hit[1], "X-Sapwood-Cache": state})


@router.get(
    "/{call_id}/output.bin",
    response_class=Response,
    responses={**NOT_FOUND, 200: {"description": "n packed little-endian int32 output token ids, then their n "
                                                 "float32 rollout log-probs (8n bytes)",
                                  "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                      "format": "binary"}}}}},
)
async def call_output_binary(call_id: uuid.UUID, services: ServicesDep, _key: ReadKey) -> Response:
    """The output as packed little-endian int32 token ids followed by their float32 rollout log-probs
    (``X-Sapwood-Token-Count`` = n; ``numpy.frombuffer(body[:4*n], "<i4")``, ``body[4*n:]`` as ``"<f4"``)."""
    cid = str(call_id)

    def build() -> Cached:
        with services.read() as conn:
            row = q.call_row(conn, cid)
        ids = decode_span(row["out_encoding"], row["out_data"])
        lps = decode_span(row["lp_encoding"], row["lp_data"])
        return ids + lps, {"X-Sapwood-Token-Count": str(len(ids) // 4), "X-Sapwood-Policy-Version":
                           str(row["policy_version"])}

    hit, state = await cached(services, ("output.bin", cid), build)
    return Response(hit[0], media_type="application/octet-stream", headers={**hit[1], "X-Sapwood-Cache": state})
