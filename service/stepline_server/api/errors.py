"""API errors and the one handler that maps them to the error shape of openapi.yaml.

ApiError                      code, status, message, details
 ├── InvalidJson              400 invalid_json
 ├── BodyNotAllowed           400 body_not_allowed (the route takes no body)
 ├── ValidationFailed         422 validation_failed (details name the fields)
 ├── PayloadTooLarge          413 payload_too_large
 ├── Unauthorized             401 unauthorized
 ├── Forbidden                403 forbidden (the key's role does not allow it)
 ├── NotFound                 404 not_found
 ├── RunKeyConflict           409 run_key_conflict
 ├── InvalidState             409 invalid_state
 ├── RequestTimeout           408 request_timeout (the body arrived too slowly)
 ├── StaleInvocation          409 stale_invocation
 ├── RateLimited              429 rate_limited (with a Retry-After header)
 ├── AppUnreachable           502 app_unreachable
 └── Unavailable              503 unavailable (the database is away; Retry-After)
"""

from __future__ import annotations

from typing import Any

import orjson
import structlog
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from stepline_server.application import payloads

log = structlog.get_logger("stepline.api")


class ApiError(Exception):
    """An error answered to the caller."""

    code = "internal"
    status = 500
    default = "something went wrong"

    def __init__(self, message: str | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(message or self.default)
        self.message = message or self.default
        self.details = details or {}


class InvalidJson(ApiError):
    code, status, default = "invalid_json", 400, "the request body is not valid JSON"


class BodyNotAllowed(ApiError):
    code, status, default = "body_not_allowed", 400, "this route takes no request body"


class ValidationFailed(ApiError):
    code, status, default = "validation_failed", 422, "the request is not valid"


class PayloadTooLarge(ApiError):
    code, status, default = "payload_too_large", 413, "the request body is larger than 1 MiB"


class Unauthorized(ApiError):
    code, status, default = "unauthorized", 401, "a valid API key is required"


class Forbidden(ApiError):
    code, status, default = "forbidden", 403, "the API key's role does not allow this"


class RateLimited(ApiError):
    code, status, default = "rate_limited", 429, "too many requests; try again later"

    def __init__(
        self,
        message: str | None = None,
        details: dict[str, Any] | None = None,
        *,
        retry_after: int = 60,
    ) -> None:
        super().__init__(message, details)
        self.retry_after = retry_after


class NotFound(ApiError):
    code, status, default = "not_found", 404, "not found"


class RunKeyConflict(ApiError):
    code, status, default = "run_key_conflict", 409, "the run key belongs to another run"


class InvalidState(ApiError):
    code, status, default = "invalid_state", 409, "not allowed in the current state"


class RequestTimeout(ApiError):
    code, status, default = "request_timeout", 408, "the request body arrived too slowly"


class StaleInvocation(ApiError):
    code, status, default = "stale_invocation", 409, "another invocation owns the run now"


class AppUnreachable(ApiError):
    code, status, default = "app_unreachable", 502, "the app could not be reached"


def from_validation(exc: ValidationError) -> ValidationFailed:
    """A pydantic error as a 422 naming each bad field."""
    refused = payloads.invalid_fields(exc)
    return ValidationFailed(refused.message, refused.details)


def from_payload(exc: payloads.BadPayload) -> ApiError:
    """JSON the shared checks refused, as the API's error of the same code."""
    kind = {"invalid_json": InvalidJson, "payload_too_large": PayloadTooLarge}.get(
        exc.code, ValidationFailed
    )
    return kind(exc.message, exc.details)


def error_body(exc: ApiError) -> dict[str, Any]:
    """the error shape of openapi.yaml: ``{"error": {code, message, details?}}``."""
    body: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.details:
        body["details"] = exc.details
    return {"error": body}


def error_headers(exc: ApiError) -> dict[str, str]:
    """Headers an error answer carries (``Retry-After`` for a 429 and a 503)."""
    if isinstance(exc, (RateLimited, Unavailable)):
        return {"retry-after": str(exc.retry_after)}
    return {}


def error_response(exc: ApiError) -> Response:
    response = Response(orjson.dumps(error_body(exc)), exc.status, media_type="application/json")
    response.headers.update(error_headers(exc))
    return response


async def handle_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def handle_bad_payload(request: Request, exc: Exception) -> Response:
    """JSON a shared check refused (a body, an alert's destination), as the API's error."""
    assert isinstance(exc, payloads.BadPayload)
    return error_response(from_payload(exc))


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such path, wrong method) in the same error shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(NotFound(f"no route for {request.url.path}"))
    if exc.status_code == 405:
        error = ApiError(f"{request.method} is not allowed on {request.url.path}")
        error.code, error.status = "method_not_allowed", 405
        return error_response(error)
    error = ApiError(str(exc.detail))
    error.code, error.status = f"http_{exc.status_code}", exc.status_code
    return error_response(error)


class Unavailable(ApiError):
    code, status, default = "unavailable", 503, "the database is not reachable; try again shortly"
    retry_after = 1


def route_of(scope: Any) -> str:
    """The route's template (``/v1/callbacks/{callbackId}/{signature}``), never the path
    itself: a signed callback URL must not be written to the logs."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "(unrouted)"


async def handle_unavailable(request: Request, exc: Exception) -> Response:
    """The database is away (a restart, a failover: see ``db.UNAVAILABLE``): an expected
    state, answered ``503`` with ``Retry-After`` on a connection that stays open. What the
    request wrote was not confirmed; every write the API takes is safe to send again."""
    log.warning("request_unavailable", route=route_of(request.scope), error=str(exc))
    return error_response(Unavailable())


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("request_failed", route=route_of(request.scope), method=request.method)
    return error_response(ApiError())
