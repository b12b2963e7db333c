"""Which JSON Schemas the grammar backend enforces exactly: the rest are refused, never loosened.

xgrammar compiles every schema it can parse, but it enforces only part of JSON Schema: keywords it
does not know are dropped, and a type-specific keyword in a subschema without a "type" (`{"minimum":
1}`) is dropped too, so the grammar would admit outputs the schema forbids. A client that asked for
a schema and got a reply that breaks it has been given a wrong answer, so `unsupported_reason` walks
the schema first and names the first construct the grammar would not hold, with its JSON pointer
and the fix; GrammarCache.compile turns that into ConstraintError (HTTP 400 / INVALID_ARGUMENT).

The rules come from measurement, not from xgrammar's docs: tests/structured_output/test_schema_support.py
runs every schema of the JSON Schema Test Suite (draft 2020-12) that this gate accepts through the
compiled grammar and checks that the grammar accepts none of the instances the suite marks invalid.
(The grammar may be stricter than the schema: xgrammar's strict mode closes objects to unlisted
properties unless additionalProperties says otherwise. Stricter output still validates.)
"""

from __future__ import annotations

from typing import Any

# Keywords that carry no constraint (annotations) or that this walker resolves itself.
_ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "title", "description", "default", "examples",
                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "$ref"})
# Keywords the grammar enforces, by the JSON type they constrain (None: any type).
_BY_TYPE: dict[str | None, frozenset[str]] = {
    None: frozenset({"type", "enum", "const", "anyOf", "allOf"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems"}),
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
}
_BY_TYPE["integer"] = _BY_TYPE["number"]
_TYPED = {keyword: kind for kind, words in _BY_TYPE.items() if kind is not None for keyword in words}
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
# String formats the grammar enforces, measured against the Test Suite's optional/format cases. date,
# time and date-time hold their syntax but not the calendar (it admits "2021-02-29" and leap seconds);
# hostname (label lengths), ipv4 (leading zeros) and the idn-/iri- formats are looser than their RFCs,
# so they are refused with the rest.
_FORMATS = frozenset({"date", "time", "date-time", "duration", "email", "ipv6", "uuid", "uri", "uri-reference",
                      "uri-template", "json-pointer", "relative-json-pointer"})
CALENDAR_FORMATS = frozenset({"date", "time", "date-time"})
# What to send instead of a keyword the grammar does not enforce.
_HINTS = {
    "oneOf": "the grammar can only enforce it as anyOf; send anyOf if overlapping branches are acceptable",
    "not": "rewrite the schema without negation (an enum, or a pattern)",
    "if": "spell the cases out with anyOf", "then": "spell the cases out with anyOf",
    "else": "spell the cases out with anyOf",
    "uniqueItems": "drop it and deduplicate the reply", "contains": "list the items with prefixItems",
    "minContains": "list the items with prefixItems", "maxContains": "list the items with prefixItems",
    "patternProperties": "name the properties under properties",
    "propertyNames": "name the properties under properties",
    "dependentRequired": "spell the cases out with anyOf", "dependentSchemas": "spell the cases out with anyOf",
    "multipleOf": "drop it or use an enum", "minProperties": "list required properties instead",
    "maxProperties": "set additionalProperties to false and list the properties",
    "unevaluatedProperties": "use additionalProperties", "unevaluatedItems": "use items",
    "$dynamicRef": "use $ref to '#/$defs/...'", "$anchor": "use $ref to '#/$defs/...'",
    "$dynamicAnchor": "use $ref to '#/$defs/...'",
}


class _Unsupported(Exception):
    pass


def unsupported_reason(schema: Any) -> str | None:
    """None when the grammar enforces `schema` (a parsed JSON Schema) exactly enough that every output
    validates; otherwise what it would not enforce, where, and how to fix it."""
    try:
        _check(schema, "#", schema, set())
    except _Unsupported as error:
        return str(error)
    return None


def _fail(path: str, message: str) -> None:
    raise _Unsupported(f"at {path}: {message}")


def _resolve(root: Any, ref: str, path: str) -> Any:
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        _fail(path, f"$ref {ref!r} points outside this schema; only local references ('#/$defs/...') "
                    "are resolved (no schema is fetched); inline the referenced schema")
    node = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            _fail(path, f"$ref {ref!r} does not resolve inside this schema")
    return node


def _check(node: Any, path: str, root: Any, refs_seen: set[str]) -> None:
    if isinstance(node, bool):
        return   # true: anything; false: nothing (xgrammar enforces both)
    if not isinstance(node, dict):
        _fail(path, f"a schema must be an object or a boolean, not {type(node).__name__}")
    for name in ("$defs", "definitions"):
        if name in node and not isinstance(node[name], dict):
            _fail(f"{path}/{name}", "must be an object of named schemas")
    if "$ref" in node:
        others = set(node) - _ANNOTATIONS
        if others:
            _fail(path, f"$ref beside {sorted(others)}: the grammar follows the reference and would drop "
                        "the sibling keywords; move them into the referenced schema or wrap both in allOf")
        ref = node["$ref"]
        if not isinstance(ref, str):
            _fail(path, "$ref must be a string")
        if ref not in refs_seen:   # each definition checked once (recursive schemas terminate)
            _check(_resolve(root, ref, path), ref, root, refs_seen | {ref})
        return
    kind = node.get("type")
    kinds: set[str]
    if kind is None:
        kinds = set()
    elif isinstance(kind, str) and kind in _TYPES:
        kinds = {kind}
    elif isinstance(kind, list) and kind and all(isinstance(k, str) and k in _TYPES for k in kind):
        kinds = set(kind)
    else:
        _fail(f"{path}/type", f"{kind!r} is not a JSON type or a list of them")
    for keyword in node:
        if keyword in _ANNOTATIONS or keyword in _BY_TYPE[None]:
            continue
        if keyword in _HINTS:
            _fail(path, f"the grammar backend does not enforce {keyword!r}; {_HINTS[keyword]}")
        family = _TYPED.get(keyword)
        if family is None:
            _fail(path, f"unknown or unsupported keyword {keyword!r}; remove it (the grammar would ignore it)")
        accepted = {family} | ({"integer", "number"} if family in ("integer", "number") else set())
        if not kinds & accepted:
            _fail(path, f"{keyword!r} constrains {family} values but this schema has no \"type\": "
                        f"{family!r}; without it the grammar admits any JSON here; add the type")
        if len(kinds) > 1:
            _fail(path, f"{keyword!r} beside a list of types {sorted(kinds)}: the grammar would apply it "
                        "to none of them; split the types with anyOf, one schema per type")
    if "format" in node and node["format"] not in _FORMATS:
        _fail(path, f"string format {node['format']!r} is not enforced by the grammar; supported: "
                    f"{sorted(_FORMATS)}; drop it or use a pattern")
    if "required" in node:
        props = node.get("properties", {})
        missing = [k for k in node["required"] if k not in props]
        if missing and node.get("additionalProperties") is not False:
            _fail(path, f"required {missing} are not listed under properties; the grammar enforces only "
                        "required properties it knows: add them to properties")
    if "allOf" in node:
        branches = node["allOf"]
        if not isinstance(branches, list) or len(branches) != 1 or set(node) - _ANNOTATIONS - {"allOf"}:
            _fail(path, "allOf is enforced only with one branch and nothing beside it; merge the branches "
                        "into one schema")
    for keyword in ("anyOf", "allOf", "prefixItems"):
        for i, sub in enumerate(node.get(keyword, ())):
            _check(sub, f"{path}/{keyword}/{i}", root, refs_seen)
    for name, sub in node.get("properties", {}).items():
        _check(sub, f"{path}/properties/{name}", root, refs_seen)
    for keyword in ("items", "additionalProperties"):
        if keyword in node:
            _check(node[keyword], f"{path}/{keyword}", root, refs_seen)
