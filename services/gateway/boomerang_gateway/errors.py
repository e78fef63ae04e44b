"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

# The `type` OpenAI uses for each status.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class ApiError(Exception):
    """An error to return to the client as OpenAI-style JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        """The HTTP response."""
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def engine_status(status: int) -> int:
    """The status to give the client for an engine's error status.

    Client errors pass through (the engine judged the request: too long, bad sampling
    parameters); an engine's own failure is the gateway's upstream failure, 502.
    """
    if 400 <= status < 500 and status not in (401, 403, 407, 408):
        return status
    if status in (503, 504):
        return status
    return 502


def from_engine(role: str, status: int, raw: bytes) -> ApiError:
    """An engine's error response, normalized to the OpenAI shape with the right status."""
    message, param, code, type_ = "", None, None, None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict):
        err: dict[str, Any] = data["error"] if isinstance(data.get("error"), dict) else data
        message = str(err.get("message") or "")
        param = err.get("param") if isinstance(err.get("param"), str) else None
        code = str(err["code"]) if err.get("code") is not None else None
        type_ = err.get("type") if isinstance(err.get("type"), str) else None
    if not message:
        message = raw[:500].decode("utf-8", "replace").strip() or f"HTTP {status}"
    out = engine_status(status)
    if out != status:
        message = f"{role} engine failed (HTTP {status}): {message}"
        type_, code = "upstream_error", code or str(status)
    return ApiError(out, message, param=param, code=code, type_=type_)
