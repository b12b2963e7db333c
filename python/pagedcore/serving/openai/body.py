"""Reading a request body: the size limit (413) and JSON -> request model with 400s that name the field."""

from __future__ import annotations

import asyncio
import logging

from fastapi import Request
from pydantic import BaseModel, ValidationError

from pagedcore.serving.openai.errors import APIError, bad_request
from pagedcore.serving.openai.protocol import UNION_TYPES

logger = logging.getLogger(__name__)

BODY_TIMEOUT_S = 30.0   # the whole body must arrive within this after the headers


def too_large(size: int | None, limit: int) -> APIError:
    what = f"is {size} bytes, more than" if size is not None else "is larger than"
    return APIError(413, f"the request body {what} this server's limit of {limit} bytes; send a smaller "
                         "request or start the server with a larger --max-request-body-bytes")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing (413) as soon as it passes `limit` bytes, declared or streamed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(None, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def check_content_type(request: Request) -> None:
    """415 for a body that says it is not JSON (a form post, text/plain: also what a cross-site
    browser page may send without a CORS preflight). No Content-Type at all is read as JSON, as
    FastAPI does. `curl -d` without -H sends a form type and gets 415 naming the header to add."""
    content_type = request.headers.get("content-type")
    if content_type is None:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return
    raise APIError(415, f"the request body must be JSON, but its Content-Type is {content_type[:100]!r}; "
                        "send the header 'Content-Type: application/json'", code="unsupported_media_type")


async def read_body_in_time(request: Request, limit: int, timeout: float = BODY_TIMEOUT_S) -> bytes:
    """read_body, but a client that trickles its body (slowloris) is cut off with 408."""
    try:
        return await asyncio.wait_for(read_body(request, limit), timeout)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout:.0f} s; send it at once") from None


async def parse_request(request: Request, model: type[BaseModel], limit: int) -> BaseModel:
    check_content_type(request)
    body = await read_body_in_time(request, limit)
    if not body.strip():
        raise bad_request("the request body is empty; send a JSON object")
    try:
        parsed = model.model_validate_json(body)
    except ValidationError as error:
        raise bad_request(*describe(error)) from None
    if parsed.model_extra:
        # Fields no model here knows (a typo, another server's extension). Fields that would change the
        # output and are not supported are modelled and refused with a 400 (params.py); these are only
        # reported: in the log and, so the client sees it too, in the IGNORED_FIELDS_HEADER of the answer.
        ignored = sorted(parsed.model_extra)
        logger.warning("ignoring fields this server does not support: %s", ", ".join(ignored))
        request.state.ignored_fields = ignored
    return parsed


IGNORED_FIELDS_HEADER = "pagedcore-ignored-fields"


def report_ignored_fields(request: Request, response):
    """The response, with the request's ignored fields (if any) named in IGNORED_FIELDS_HEADER."""
    ignored = getattr(request.state, "ignored_fields", None)
    if ignored:
        response.headers[IGNORED_FIELDS_HEADER] = ", ".join(ignored)[:1000]
    return response


def describe(error: ValidationError) -> tuple[str, str | None]:
    """pydantic's errors -> one message and the dotted path of the field at fault."""
    errors = error.errors(include_url=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        return f"the request body is not valid JSON ({first['msg'].removeprefix('Invalid JSON: ')})", None
    loc = [str(p) for p in first["loc"]]
    if not loc:
        return "the request body must be a JSON object", None
    # A value that fits no member of a union yields one error per member: name the union instead.
    path = _union_path(loc)
    if path is not None and len(errors) > 1:
        # An error inside a member that matched in shape (a list with one bad item) says the most.
        deeper = [e for e in errors if len(e["loc"]) > len(path) + 1]
        if len({str(e["loc"][len(path)]) for e in deeper}) == 1:
            first, loc = deeper[0], [str(p) for p in deeper[0]["loc"]]
        else:
            param = ".".join(path)
            return f"{param} must be {UNION_TYPES[path[-1]]}, got {_json_type(first.get('input'))}", param
    param = ".".join(p for p in loc if not _is_type_tag(p))
    if first["type"] == "missing":
        return f"{param} is required", param
    return f"{param}: {first['msg']} (got {_show(first.get('input'))})", param


def _union_path(loc: list[str]) -> list[str] | None:
    for i, part in enumerate(loc):
        if part in UNION_TYPES:
            return loc[:i + 1]
    return None


def _is_type_tag(part: str) -> bool:
    # pydantic puts the union member it tried into the path ("prompt.list[int].0"); the client never wrote it
    return "[" in part or part in ("str", "int", "float", "bool", "dict", "list", "ContentPart")


def _json_type(value) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
