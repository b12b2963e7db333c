"""The schema gate (structured_output/schema_support.py) against the JSON Schema Test Suite.

The property held: for every schema the gate accepts, the compiled grammar accepts no instance that
`jsonschema` (for formats: the suite) finds invalid. Tokenizer-free (xgrammar's Grammar before
compilation against a vocabulary), so it runs the whole suite in seconds. The schemas are the suite's
as written, and each again with the "type" its typed keywords imply added, since the suite mostly
leaves types out and real schemas rarely do.
"""

from __future__ import annotations

import copy
import json

import pytest

jsonschema = pytest.importorskip("jsonschema")
xgr = pytest.importorskip("xgrammar")
from xgrammar.testing import _is_grammar_accept_string as grammar_accepts  # noqa: E402

from pagedcore.structured_output.schema_support import (  # noqa: E402
    _TYPED, CALENDAR_FORMATS, _FORMATS, unsupported_reason)
from tests.structured_output.schema_corpus import SUITE, realistic_schemas, suite_groups  # noqa: E402


def with_implied_types(node):
    """node with "type" added wherever its keywords name exactly one type family."""
    if not isinstance(node, dict):
        return node
    node = dict(node)
    for key in ("properties", "$defs", "definitions"):
        if isinstance(node.get(key), dict):
            node[key] = {k: with_implied_types(v) for k, v in node[key].items()}
    for key in ("items", "additionalProperties"):
        if key in node:
            node[key] = with_implied_types(node[key])
    for key in ("anyOf", "allOf", "prefixItems"):
        if isinstance(node.get(key), list):
            node[key] = [with_implied_types(v) for v in node[key]]
    families = {"number" if _TYPED[k] == "integer" else _TYPED[k] for k in node if k in _TYPED}
    if "type" not in node and "$ref" not in node and len(families) == 1:
        node["type"] = families.pop()
    return node


def compile_grammar(schema):
    try:
        return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=True, strict_mode=True)
    except (RuntimeError, ValueError):
        return None   # refused by xgrammar itself: a 400 as well


def test_every_accepted_suite_schema_admits_no_invalid_instance():
    accepted, checked, loose = 0, 0, []
    for name, group in suite_groups(SUITE):
        for schema in (group["schema"], with_implied_types(copy.deepcopy(group["schema"]))):
            if unsupported_reason(schema) is not None:
                continue
            grammar = compile_grammar(schema)
            if grammar is None:
                continue
            accepted += 1
            validator = jsonschema.Draft202012Validator(schema)
            for case in group["tests"]:
                checked += 1
                text = json.dumps(case["data"])
                if grammar_accepts(grammar, text) and not validator.is_valid(case["data"]):
                    loose.append(f"{name}: {json.dumps(schema)[:120]} admits {text[:60]}")
    assert loose == []
    # Not vacuous: the gate lets a good part of the suite through (167 schema variants and 657 instances
    # with xgrammar 0.2.8).
    assert accepted >= 100 and checked >= 400, (accepted, checked)


def test_enforced_formats_admit_only_calendar_slips():
    """Each accepted format against the suite's optional/format cases (which assert formats): the
    grammar admits no invalid string, except impossible dates and leap seconds in the calendar formats
    (their syntax holds), which docs/structured-output.md states."""
    seen, loose = set(), []
    for name, group in suite_groups(SUITE / "format"):
        schema = {**group["schema"], "type": "string"}
        if unsupported_reason(schema) is not None:
            continue
        grammar = compile_grammar(schema)
        assert grammar is not None, schema
        seen.add(name)
        for case in group["tests"]:
            if isinstance(case["data"], str) and not case["valid"] and grammar_accepts(grammar, json.dumps(case["data"])):
                loose.append((name, case["data"]))
    assert seen == set(_FORMATS), sorted(set(_FORMATS) ^ seen)
    assert {name for name, _ in loose} <= CALENDAR_FORMATS, loose


@pytest.mark.parametrize("schema, words", [
    ({"type": "integer", "multipleOf": 3}, ["'multipleOf'", "at #"]),
    ({"type": "object", "properties": {"n": {"minimum": 1}}}, ["#/properties/n", "'minimum'", "add the type"]),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, ["'oneOf'", "anyOf"]),
    ({"$ref": "https://example.com/s.json"}, ["outside this schema", "inline"]),
    ({"$ref": "#/$defs/missing"}, ["does not resolve"]),
    ({"type": "string", "format": "hostname"}, ["'hostname'", "pattern"]),
    ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, ["allOf", "merge"]),
    ({"type": ["string", "integer"], "maxLength": 3}, ["list of types", "anyOf"]),
    ({"type": "object", "required": ["a"]}, ["required ['a']", "properties"]),
    ({"type": "array", "items": {"type": "object", "patternProperties": {"^x": {}}}}, ["#/items", "patternProperties"]),
    ({"type": "thing"}, ["#/type", "not a JSON type"]),
])
def test_refusals_name_the_place_the_keyword_and_the_fix(schema, words):
    reason = unsupported_reason(schema)
    assert reason is not None
    for word in words:
        assert word in reason, reason


def test_recursive_and_realistic_schemas_pass():
    corpus = realistic_schemas()
    assert len(corpus) >= 20
    for name, schema in corpus.items():
        assert unsupported_reason(schema) is None, name
        assert compile_grammar(schema) is not None, name


def test_the_cache_refuses_what_the_gate_refuses():
    from pagedcore.sampling_params import StructuredOutputsParams
    from pagedcore.structured_output.compiler import ConstraintError, GrammarCache

    cache = GrammarCache(tokenizer=None, vocab_size=16, stop_token_ids=[0])
    with pytest.raises(ConstraintError) as info:   # refused before any tokenizer is needed
        cache.compile(StructuredOutputsParams(json='{"type": "integer", "multipleOf": 2}'))
    assert info.value.field == "json" and "multipleOf" in str(info.value)
