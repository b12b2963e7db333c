"""The FastAPI app: routes, API-key protection and the error handlers that keep every client error in
OpenAI's shape. Handlers live in serving/openai/; this file only wires them."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagedcore import __version__
from pagedcore.serving.auth import APIKeyCheck
from pagedcore.serving.metrics import CONTENT_TYPE
from pagedcore.serving.openai import lora_admin
from pagedcore.serving.openai.chat import create_chat_completion
from pagedcore.serving.openai.completions import create_completion
from pagedcore.serving.openai.body import report_ignored_fields
from pagedcore.serving.openai.errors import APIError, api_error_response, error_response
from pagedcore.serving import openapi_schema
from pagedcore.serving.openai.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                               TokenizeRequest)
from pagedcore.serving.openai.tokenize import detokenize, tokenize
from pagedcore.serving.openapi_schema import json_body
from pagedcore.serving.state import ServerState

logger = logging.getLogger(__name__)


def build_app(state: ServerState, recorder=None) -> FastAPI:
    """recorder: the simulator's TraceRecorder on the engine (--enable-trace), for its live page."""
    app = FastAPI(title="pagedcore", version=__version__,
                  description="OpenAI-compatible completions and chat on a paged-KV engine")
    app.state.server = state
    _add_error_handlers(app)
    if state.cors is not None:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=state.cors.allowed_origins,
                           allow_methods=state.cors.allowed_methods, allow_headers=state.cors.allowed_headers,
                           allow_credentials=state.cors.allow_credentials)

    protected = APIRouter(dependencies=[Depends(APIKeyCheck(state.api_keys))])

    @protected.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
    async def completions(request: Request) -> Response:
        return report_ignored_fields(request, await create_completion(request, state))

    @protected.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        return report_ignored_fields(request, await create_chat_completion(request, state))

    @protected.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [_model_card(state, name) for name in _served(state)]
                + lora_admin.adapter_cards(state)}

    @protected.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> dict:
        state.require_loaded()
        if state.check_model(model) is not None:  # a LoRA adapter
            return next(card for card in lora_admin.adapter_cards(state) if card["id"] == model)
        return _model_card(state, model)

    if lora_admin.runtime_updating_allowed():  # vLLM's switch: without it these routes do not exist
        @protected.post("/v1/load_lora_adapter")
        async def load_lora_adapter(request: Request) -> Response:
            return await lora_admin.load_lora_adapter(request, state)

        @protected.post("/v1/unload_lora_adapter")
        async def unload_lora_adapter(request: Request) -> Response:
            return await lora_admin.unload_lora_adapter(request, state)

    @protected.post("/tokenize", openapi_extra=json_body(TokenizeRequest))
    async def tokenize_route(request: Request) -> dict:
        return await tokenize(request, state)

    @protected.post("/detokenize", openapi_extra=json_body(DetokenizeRequest))
    async def detokenize_route(request: Request) -> dict:
        return await detokenize(request, state)

    app.include_router(protected)

    @app.get("/health")
    async def health() -> Response:
        if state.engine is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        if state.draining or not state.engine.accepting:
            return JSONResponse({"status": "draining" if state.engine.error is None else "failed"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        body = state.metrics.render() if state.metrics is not None else b""
        return Response(body, media_type=CONTENT_TYPE)

    _mount_simulator(app, state, recorder)
    openapi_schema.install(app)
    return app


def _mount_simulator(app: FastAPI, state: ServerState, recorder) -> None:
    """The live simulator page at / (replay and model-free simulation always; the live trace with
    --enable-trace). In-tree, so a failing import is a bug and stops the server."""
    from pagedcore.simulator import simulator_router

    app.include_router(simulator_router(state, recorder))


def _served(state: ServerState) -> list[str]:
    state.require_loaded()
    return state.served_model_names


def _model_card(state: ServerState, name: str) -> dict:
    return {"id": name, "object": "model", "created": state.created, "owned_by": "pagedcore",
            "root": state.model_path, "parent": None, "max_model_len": state.max_model_len}


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> Response:
        return api_error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        # Unknown routes (404), wrong methods (405): FastAPI's {"detail"} in OpenAI's shape.
        message = str(error.detail)
        if error.status_code in (404, 405):
            message = (f"{request.method} {request.url.path}: {message.lower()}; the routes are /v1/completions, "
                       "/v1/chat/completions, /v1/models, /tokenize, /detokenize (POST except /v1/models), "
                       "/health, /metrics, /version, and the simulator page at /")
        return error_response(error.status_code, message, headers=getattr(error, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> Response:
        # Our handlers parse bodies themselves; this only catches path/query parameters. 400, not 422.
        first = error.errors()[0] if error.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
        return error_response(400, f"{param}: {first.get('msg', 'invalid request')}", param or None)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, error: Exception) -> Response:
        logger.exception("unhandled error")
        return error_response(500, f"internal server error ({type(error).__name__}: {error}); this is a bug in "
                                   "pagedcore, please report it with the request that caused it")
