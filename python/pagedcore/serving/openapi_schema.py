"""The OpenAPI document's request bodies. Handlers parse their bodies themselves (for OpenAI-shaped
400s), so FastAPI cannot see them: each POST route declares its pydantic model here, and the
models' shared definitions go under components/schemas. Clients, docs and the fuzzer
(tests/serving/test_fuzz.py) then all read the real bodies."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

REF = "#/components/schemas/{model}"
_MODELS: dict[str, type[BaseModel]] = {}   # name -> body model, filled by json_body()


def json_body(model: type[BaseModel]) -> dict:
    """`openapi_extra` for a route whose JSON body is `model`."""
    _MODELS[model.__name__] = model
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": REF.format(model=model.__name__)}}}},
        "x-pagedcore-body": model.__name__}


def install(app: FastAPI) -> None:
    """Replaces app.openapi with one that adds every declared body model (and its $defs) to components."""
    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                name = operation.pop("x-pagedcore-body", None)
                if name is None:
                    continue
                model = _MODELS[name]
                body = model.model_json_schema(ref_template=REF)
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
