"""Runtime LoRA loading over HTTP, as vLLM does it: POST /v1/load_lora_adapter and
/v1/unload_lora_adapter, present only when VLLM_ALLOW_RUNTIME_LORA_UPDATING is true (vLLM's switch),
and the adapters' /v1/models cards (parent: the base model)."""

from __future__ import annotations

import itertools
import json
import os

from fastapi import Request
from fastapi.responses import PlainTextResponse

from pagedcore.serving.openai.errors import APIError
from pagedcore.serving.state import ServerState

RUNTIME_SWITCH = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def runtime_updating_allowed() -> bool:
    return os.environ.get(RUNTIME_SWITCH, "").strip().lower() in ("1", "true", "yes")


def adapter_cards(state: ServerState) -> list[dict]:
    manager = state.lora_manager
    if manager is None:
        return []
    return [{"id": r.lora_name, "object": "model", "created": state.created, "owned_by": "pagedcore",
             "root": r.lora_path, "parent": r.base_model_name or state.model_name, "max_model_len": state.max_model_len}
            for r in manager.list_adapters()]


async def _body(request: Request, fields: tuple[str, ...]) -> dict:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise APIError(400, "the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise APIError(400, "the body must be a JSON object")
    for name in fields:
        if not isinstance(body.get(name), str) or not body[name]:
            raise APIError(400, f"{name} is required (a non-empty string)", param=name)
    return body


def _manager(state: ServerState):
    state.require_loaded()
    if state.lora_manager is None:
        raise APIError(400, "LoRA is off on this server; start it with --enable-lora")
    return state.lora_manager


_next_ids = itertools.count(1 << 20)  # runtime adapters' ids, clear of --lora-modules' 1..n


async def load_lora_adapter(request: Request, state: ServerState) -> PlainTextResponse:
    from pagedcore.lora import LoRAError, LoRARequest

    body = await _body(request, ("lora_name", "lora_path"))
    manager = _manager(state)
    name = body["lora_name"]
    if name in state.served_model_names or name in manager.known:
        raise APIError(400, f"the LoRA adapter {name!r} has already been loaded (or names the base model); "
                            "unload it first or pick another name", param="lora_name")
    try:
        manager.add_adapter(LoRARequest(name, next(_next_ids), body["lora_path"]))
    except LoRAError as error:
        raise APIError(400, str(error), param="lora_path") from None
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: Request, state: ServerState) -> PlainTextResponse:
    from pagedcore.lora import LoRAError, LoRANotFoundError

    body = await _body(request, ("lora_name",))
    manager = _manager(state)
    try:
        manager.remove_adapter(body["lora_name"])
    except LoRANotFoundError as error:
        raise APIError(404, str(error), param="lora_name", code="model_not_found") from None
    except LoRAError as error:
        raise APIError(400, str(error), param="lora_name") from None
    return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' removed successfully.")
