"""OpenAI error bodies: `{"error": {"message", "type", "param", "code"}}`.

Everything a client can get wrong becomes an `APIError` with an HTTP status
and the name of the offending field in `param` (`messages[2].role`,
`max_tokens`, ...); handlers registered by `install_error_handlers` turn it,
and any unexpected exception, into that body.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("hybridkv.serving")

# loc entries pydantic adds for union members and validators, not field names
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                404: "not_found_error", 413: "invalid_request_error",
                429: "rate_limit_error", 503: "service_unavailable"}


class APIError(Exception):
    """An error answered to the client with `status` and an OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(self.status, "server_error" if self.status >= 500
                                else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def param_of(loc: tuple[Any, ...]) -> str | None:
    """`("messages", 0, "role")` -> `"messages[0].role"`; union tags dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "body" and not out:
            continue
        elif isinstance(part, str) and (part in _TYPE_TAGS or "[" in part or "-" in part):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or None


def from_validation_error(error: ValidationError | RequestValidationError) -> APIError:
    """The first problem of a pydantic validation error, naming its field."""
    errors = error.errors()
    if not errors:
        return bad_request("invalid request body")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return bad_request(f"request body is not valid JSON: {first.get('msg')}", "body")
    if first.get("type") == "model_type" and not first.get("loc"):
        return bad_request("request body must be a JSON object")
    param = param_of(tuple(first.get("loc", ())))
    if param == "prompt" and len(errors) > 1:
        return bad_request("prompt must be a string, a list of token ids, or a list of "
                           "strings or of token-id lists", "prompt")
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if param is None:  # a check of the whole body names its field first
        named = re.match(r"(\w+): ", message)
        param = named.group(1) if named else None
    if first.get("type") == "missing":
        return bad_request(f"{param} is required", param)
    if first.get("type") == "extra_forbidden":
        return bad_request(f"{param} is not a known field", param)
    if param is None or message.startswith(f"{param}: "):
        return bad_request(message, param)
    return bad_request(f"{param}: {message}", param)


def install_error_handlers(app: FastAPI) -> None:
    """Answer APIError, validation errors, HTTP errors and crashes with OpenAI bodies."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return APIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error: %s", exc)
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()
