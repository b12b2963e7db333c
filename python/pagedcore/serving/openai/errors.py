"""Every client-visible failure as OpenAI's error object, {"error": {"message", "type", "param", "code"}}.

Handlers raise `APIError`; the app's exception handlers turn it, FastAPI's own HTTP errors and
request validation errors into that shape, so no client ever sees FastAPI's `{"detail": ...}` or a 422.
"""

from __future__ import annotations

import re
from http import HTTPStatus

from fastapi.responses import JSONResponse

from pagedcore.serving.async_engine import EngineDeadError, EngineDrainingError, QueueFullError, StepFailedError

# HTTP status -> OpenAI's error `type`, so SDKs that switch on it behave as with api.openai.com.
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
          413: "invalid_request_error", 415: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}
# "SamplingParams.top_p must be ..." -> param "top_p"
_FIELD = re.compile(r"^(?:SamplingParams|BeamSearchParams)\.(\w+)")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def from_value_error(error: ValueError, rename: dict[str, str] | None = None) -> APIError:
    """A ValueError of SamplingParams (which names the field) as a 400 naming the request's field."""
    message = str(error)
    param = None
    m = _FIELD.match(message)
    if m:
        param = (rename or {}).get(m.group(1), m.group(1))
        message = param + message[m.end():]
    # The rules are written for Python callers; a JSON client writes null, true and false.
    message = re.sub(r"\bNone\b", "null", message).replace("True or False", "true or false")
    return APIError(400, message, param)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, HTTPStatus(status).phrase),
                      "param": param, "code": code if code is not None else status}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def api_error_response(error: APIError) -> JSONResponse:
    headers = dict(error.headers or {})
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return error_response(error.status, error.message, error.param, error.code, headers or None)


def queue_full(error: QueueFullError) -> APIError:
    """429 with Retry-After (RFC 9110, seconds), which the openai SDKs and most proxies honour."""
    return APIError(429, str(error), code="queue_full", headers={"Retry-After": str(error.retry_after_s)})


def engine_error(error: BaseException) -> APIError:
    """What the engine raised for one request, as the HTTP error a client can act on."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, QueueFullError):
        return queue_full(error)
    if isinstance(error, (EngineDrainingError, EngineDeadError)):
        return APIError(503, str(error))
    if isinstance(error, ValueError):      # the engine refused the request itself
        return APIError(400, str(error))
    if isinstance(error, StepFailedError):  # already says what failed and that the server goes on
        return APIError(500, str(error))
    return APIError(500, f"the engine failed while running this request: {error}")
