"""The web trajectory viewer at ``/ui``: static HTML/JS/CSS shipped in the package (no build step, no CDN).

The page asks for an API key, keeps it in the tab's ``sessionStorage`` (never in a URL) and calls the
same ``/v1`` routes as any client. Every response under ``/ui`` carries a strict Content-Security-Policy
(scripts and styles only from this origin, no inline script), and the viewer inserts decoded text with
``textContent`` only, so text a tokenizer decodes from stored tokens cannot run as markup.
``/ui/features.json`` (public) tells the page which optional routes this server has (scheduler cells
and decisions), so it does not probe them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Scope

from sapwood.api.middleware import ResponseStartRewriter

STATIC_DIR = Path(__file__).parent / "static"
#: Optional routes the viewer shows panels for when the server has them.
OPTIONAL_ROUTES = {"cells": "/v1/cells", "decisions": "/v1/scheduler/decisions"}
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                 b"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-cache"),
]


class SecureHeaders(ResponseStartRewriter):
    """Adds :data:`SECURITY_HEADERS` to every response of the wrapped app."""

    def rewrite(self, scope: Scope, message: Message) -> None:
        names = {name for name, _ in SECURITY_HEADERS}
        message["headers"] = [*(h for h in message.get("headers", ()) if h[0].lower() not in names),
                              *SECURITY_HEADERS]


def features(app: FastAPI) -> dict[str, Any]:
    """Which optional routes the app serves and whether audits carry decoded text."""
    paths = set(app.openapi().get("paths", {}))
    out: dict[str, Any] = {name: path in paths for name, path in OPTIONAL_ROUTES.items()}
    services = app.state.sapwood
    out["tokenizer"] = services.tokenizer is not None or services.recorded_tokenizers is not None
    return out


def mount_ui(app: FastAPI) -> None:
    """Serve the viewer at ``/ui/`` and its feature list at ``/ui/features.json`` (both public)."""

    async def features_json(request: Request) -> JSONResponse:
        return JSONResponse(features(request.app), headers={k.decode(): v.decode() for k, v in SECURITY_HEADERS})

    app.add_route("/ui/features.json", features_json, methods=["GET"], include_in_schema=False)
    app.mount("/ui", SecureHeaders(StaticFiles(directory=STATIC_DIR, html=True)), name="ui")
