"""The constraint of an OpenAI request (structured output) -> StructuredOutputsParams, and its check.

Three spellings, as vLLM takes them, at most one per request:
    response_format   {"type": "json_object"} | {"type": "json_schema", "json_schema": {"schema": ...}}
    structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object": ...}
    guided_json / guided_regex / guided_choice / guided_grammar   (vLLM's older fields)
Every refusal names the request field; a constraint xgrammar cannot compile, or one over the server's
bounds (--structured-outputs-max-bytes, --structured-outputs-compile-timeout), is a 400 too, found
before the request is queued (compile() warms the engine's cache, so add_request reuses it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pagedcore.sampling_params import CONSTRAINT_KINDS, StructuredOutputsParams
from pagedcore.serving.openai.errors import APIError, bad_request
from pagedcore.serving.openai.protocol import SamplingFields
from pagedcore.structured_output.compiler import ConstraintError

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
# structured_outputs keys beyond the constraint itself that pagedcore honours (disable_fallback: one
# backend, nothing to fall back to); vLLM's others change the output in ways xgrammar here does not.
_OPTIONS = ("disable_any_whitespace", "disable_fallback")
_BACKENDS = (None, "auto", "xgrammar")
# What a 400 calls a constraint that did not compile.
_WHAT = {"json": "JSON schema", "json_object": "JSON object constraint", "regex": "regular expression",
         "choice": "list of choices", "grammar": "EBNF grammar"}


class Constraint:
    """A request's constraint and the field it came from (what a 400 names)."""

    def __init__(self, params: StructuredOutputsParams, field: str):
        self.params, self.field = params, field


def constraint_of(req: SamplingFields) -> Constraint | None:
    """The request's one constraint, or None for free text. Raises a 400 for two, or a bad one."""
    found: list[tuple[str, dict[str, Any]]] = []    # (field, StructuredOutputsParams keywords)
    if req.response_format is not None:
        kwargs = _response_format(req.response_format)
        if kwargs is not None:
            found.append(("response_format", kwargs))
    if req.structured_outputs is not None:
        found.append(("structured_outputs", _structured_outputs(req.structured_outputs)))
    for name, kind in _GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            found.append((name, {kind: value}))
    if req.guided_decoding_backend not in _BACKENDS:
        raise bad_request(f"guided_decoding_backend {req.guided_decoding_backend!r} is not available; this server "
                          "compiles constraints with xgrammar (leave it unset)", "guided_decoding_backend")
    if req.guided_whitespace_pattern is not None:
        raise bad_request("guided_whitespace_pattern is not supported (xgrammar has no whitespace pattern); use "
                          "structured_outputs.disable_any_whitespace for compact JSON", "guided_whitespace_pattern")
    if not found:
        return None
    if len(found) > 1:
        raise bad_request(f"a request takes one constraint, got {found[0][0]} and {found[1][0]}; send only one",
                          found[1][0])
    field, kwargs = found[0]
    try:
        params = StructuredOutputsParams(**kwargs)
    except ValueError as error:
        message = str(error).replace("StructuredOutputsParams.", "").replace("StructuredOutputsParams", "it")
        raise bad_request(f"{field}: {message}", field) from None
    if field == "response_format" and params.json is not None:
        field = "response_format.json_schema.schema"
    elif field == "structured_outputs":
        field = f"structured_outputs.{params.kind}"
    return Constraint(params, field)


async def check_compiles(engine, constraint: Constraint | None) -> None:
    """Compiles off the event loop; a refusal is a 400 naming the field and the compiler's words."""
    if constraint is None:
        return
    try:
        await asyncio.to_thread(engine.engine.grammars.compile, constraint.params)
    except ConstraintError as error:
        if error.limit is not None:   # too large, or too slow to compile: a bound of this server
            raise bad_request(f"{constraint.field} could not be compiled: {error.reason}", constraint.field) from None
        raise bad_request(f"{constraint.field} is not a valid {_WHAT[error.field]}: {error.reason}",
                          constraint.field) from None
    except ValueError as error:
        raise APIError(400, str(error), constraint.field) from None



def _response_format(value: dict[str, Any]) -> dict[str, Any] | None:
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise bad_request('response_format of type "json_schema" needs a "json_schema" object with a '
                              '"schema"', "response_format.json_schema")
        schema = spec.get("schema", spec.get("json_schema"))
        if not isinstance(schema, dict):
            raise bad_request('response_format.json_schema needs "schema": the JSON schema object',
                              "response_format.json_schema.schema")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request("response_format.json_schema.strict must be true, false or null",
                              "response_format.json_schema.strict")
        # strict or not, the output follows the schema exactly (xgrammar's strict mode, vLLM's behaviour).
        return {"json": schema}
    raise bad_request(f"response_format type {kind!r} is not supported; use \"text\", \"json_object\" or "
                      "\"json_schema\"", "response_format.type")


def _structured_outputs(value: dict[str, Any]) -> dict[str, Any]:
    allowed = set(CONSTRAINT_KINDS) | set(_OPTIONS)
    for key in value:
        if key not in allowed:
            raise bad_request(f"structured_outputs.{key} is not supported by this server; it takes "
                              f"{', '.join(CONSTRAINT_KINDS + _OPTIONS)}", f"structured_outputs.{key}")
    return {k: v for k, v in value.items() if v is not None}
