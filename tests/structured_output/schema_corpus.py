"""The schema corpus of the structured-output tests: the JSON Schema Test Suite (draft 2020-12,
vendored under corpus/json_schema_test_suite, see its README) and 22 realistic schemas
(corpus/realistic_schemas.json: nested objects, arrays, enums, anyOf, recursive $ref, formats,
ranges, patterns)."""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"
SUITE = CORPUS / "json_schema_test_suite"


def suite_groups(directory: Path = SUITE):
    """(file stem, {"description", "schema", "tests": [{"data", "valid"}]}) for every group."""
    for path in sorted(directory.glob("*.json")):
        for group in json.loads(path.read_text()):
            yield path.stem, group


def realistic_schemas() -> dict[str, dict]:
    return json.loads((CORPUS / "realistic_schemas.json").read_text())


def generation_corpus(num_suite: int, accepts) -> dict[str, dict]:
    """The realistic schemas, then the first num_suite distinct object schemas of the suite that
    `accepts(schema)` (the gate and xgrammar) takes, in file order: a fixed, reviewable list."""
    corpus = dict(realistic_schemas())
    seen: set[str] = set()
    for name, group in suite_groups():
        schema = group["schema"]
        key = json.dumps(schema, sort_keys=True)
        if len(seen) >= num_suite or not isinstance(schema, dict) or key in seen or not accepts(schema):
            continue
        seen.add(key)
        corpus[f"suite/{name}/{group['description']}"] = schema
    return corpus
