"""LoRAManager: which adapters the engine knows, which are loaded, which sit in the layers' slots.

  known      name -> LoRARequest: every adapter a client may name (--lora-modules, runtime loads,
             offline lora_request=); loading is lazy after the first check.
  loaded     an LRU of at most max_cpu_loras adapters read from disk (fp32, the model's layout);
             one in use by an unfinished request is never evicted.
  slots      max_loras places in every adapted layer's weight stacks; the scheduler puts at most
             max_loras distinct adapters in a step, so each step's adapters always fit.

prepare() turns a step's per-sequence adapter ids into the kernel's token groups with numpy: one
Python iteration per distinct adapter of the step (<= max_loras), none per token.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from pagedcore.lora.errors import LoRAError, LoRANotFoundError
from pagedcore.lora.layer_weights import LoRABatch, LoRABatchRef, LoRALayerWeights
from pagedcore.lora.peft_adapter import LoRAAdapter, load_peft_adapter
from pagedcore.lora.request import LoRARequest

logger = logging.getLogger(__name__)


def _locked(method):
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper

# The layers an adapter may adapt, by the suffix of their name in our models.
ADAPTED_LAYERS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


class LoRAManager:
    def __init__(self, model: nn.Module, *, max_loras: int, max_lora_rank: int, max_cpu_loras: int,
                 is_request_live: Callable[[str], bool] | None = None):
        from pagedcore.layers.linear import Linear

        if max_loras < 1 or max_lora_rank < 1 or max_cpu_loras < max_loras:
            raise LoRAError(f"need max_loras >= 1, max_lora_rank >= 1 and max_cpu_loras >= max_loras; got "
                            f"{max_loras}, {max_lora_rank}, {max_cpu_loras}")
        self.model = model
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self.is_request_live = is_request_live or (lambda request_id: True)
        self.batch_ref = LoRABatchRef()
        self.layers: dict[str, LoRALayerWeights] = {}
        for name, module in list(model.named_modules()):
            if isinstance(module, Linear) and name.endswith(ADAPTED_LAYERS):
                shard_rows = getattr(module, "shard_rows", None) or {None: (0, module.out_features)}
                module.lora = LoRALayerWeights(module.in_features, shard_rows, module.out_features, max_loras,
                                               max_lora_rank, self.batch_ref)
                self.layers[name] = module.lora
        if not self.layers:
            raise LoRAError(f"{type(model).__name__} has no layers named like {ADAPTED_LAYERS}; LoRA needs a "
                            "Llama-family model")
        inner = getattr(model, "model", None)
        if hasattr(inner, "refresh_decoder_stack"):
            inner.refresh_decoder_stack()  # the C++ stack takes the steps without adapter rows only
        self.known: dict[str, LoRARequest] = {}
        self._by_id: dict[int, LoRARequest] = {}
        self._loaded: OrderedDict[int, LoRAAdapter] = OrderedDict()
        self._users: dict[int, set[str]] = {}          # adapter id -> unfinished request ids
        self._retired_ids: set[int] = set()            # ids of removed adapters: their KV may still be cached
        self._slot_ids = [0] * max_loras               # adapter id in each slot (0: empty)
        self._slot_last_used = [0] * max_loras         # step count when each slot last served
        self._num_prepares = 0
        self._step_adapter_ids: tuple[int, ...] = ()  # adapters of the latest step (metrics)
        # Front ends load and unload adapters from their own threads while the engine thread steps.
        self._lock = threading.RLock()

    # -- adapters --------------------------------------------------------------------------------
    @_locked
    def add_adapter(self, request: LoRARequest) -> LoRARequest:
        """Makes an adapter known (loading it now, so a bad one is refused here). The same name and
        id again is a no-op; a name or id already taken by another adapter raises."""
        known = self.known.get(request.lora_name)
        if known is not None:
            if known.lora_int_id != request.lora_int_id or known.lora_path != request.lora_path:
                raise LoRAError(f"an adapter named {request.lora_name!r} is already loaded (id {known.lora_int_id}, "
                                f"{known.lora_path}); unload it first or pick another name")
            return known
        if request.lora_int_id in self._retired_ids:
            raise LoRAError(f"lora_int_id {request.lora_int_id} belonged to an adapter that was unloaded, and the "
                            "prefix cache may still hold its KV under that id; give this adapter a new id")
        other = self._by_id.get(request.lora_int_id)
        if other is not None:
            raise LoRAError(f"lora_int_id {request.lora_int_id} is already used by adapter {other.lora_name!r}; "
                            "each adapter needs its own id")
        self._load(request)
        self.known[request.lora_name] = request
        self._by_id[request.lora_int_id] = request
        return request

    @_locked
    def remove_adapter(self, lora_name: str) -> LoRARequest:
        request = self.get(lora_name)
        if self._in_use(request.lora_int_id):
            raise LoRAError(f"adapter {lora_name!r} has {len(self._users[request.lora_int_id])} unfinished "
                            "request(s); unload it when they are done")
        del self.known[lora_name]
        del self._by_id[request.lora_int_id]
        self._retired_ids.add(request.lora_int_id)
        self._loaded.pop(request.lora_int_id, None)
        for slot, aid in enumerate(self._slot_ids):
            if aid == request.lora_int_id:
                self._slot_ids[slot] = 0
        return request

    @_locked
    def get(self, lora_name: str) -> LoRARequest:
        request = self.known.get(lora_name)
        if request is None:
            loaded = ", ".join(sorted(self.known)) or "none"
            raise LoRANotFoundError(f"the LoRA adapter {lora_name!r} does not exist; loaded adapters: {loaded}")
        return request

    @_locked
    def list_adapters(self) -> list[LoRARequest]:
        return sorted(self.known.values(), key=lambda r: r.lora_int_id)

    @_locked
    def acquire(self, request: LoRARequest, request_id: str) -> int:
        """For a new engine request: makes the adapter known and loaded, pins it for request_id
        (unpinned once the engine no longer has that request) and returns its id."""
        request = self.add_adapter(request)
        self._load(request)
        self._users.setdefault(request.lora_int_id, set()).add(request_id)
        return request.lora_int_id

    def _in_use(self, adapter_id: int) -> bool:
        users = self._users.get(adapter_id)
        if not users:
            return False
        users.intersection_update({rid for rid in users if self.is_request_live(rid)})
        return bool(users)

    def _load(self, request: LoRARequest) -> LoRAAdapter:
        aid = request.lora_int_id
        adapter = self._loaded.get(aid)
        if adapter is not None:
            self._loaded.move_to_end(aid)
            return adapter
        adapter = load_peft_adapter(request, self.model, self.max_lora_rank)  # raises before evicting anything
        while len(self._loaded) >= self.max_cpu_loras:
            victim = next((v for v in self._loaded if not self._in_use(v)), None)
            if victim is None:
                raise LoRAError(f"cannot load adapter {request.lora_name!r}: all {self.max_cpu_loras} loaded adapters "
                                "(--max-cpu-loras) are in use by unfinished requests; retry when some finish or raise "
                                "--max-cpu-loras")
            del self._loaded[victim]
        self._loaded[aid] = adapter
        logger.info("loaded LoRA adapter %r (id %d, rank %d, %d layers, %.1f MB)", request.lora_name, aid,
                    adapter.rank, len(adapter.layers), adapter.num_bytes / 1e6)
        return adapter

    @_locked
    def adapter_activity(self) -> tuple[list[str], list[str]]:
        """(names of the adapters in the latest step, names of other adapters with unfinished requests)."""
        running = {aid for aid in self._step_adapter_ids}
        waiting = {aid for aid in self._users if aid not in running and self._in_use(aid)}
        name = lambda aid: self._by_id[aid].lora_name if aid in self._by_id else str(aid)  # noqa: E731
        return sorted(map(name, running)), sorted(map(name, waiting))

    # -- one step --------------------------------------------------------------------------------
    @_locked
    def prepare(self, adapter_ids: np.ndarray | None, query_start_loc: np.ndarray) -> None:
        """Sets the step's token groups: adapter_ids uint64 [num_seqs] (0: base model),
        query_start_loc int32 [num_seqs + 1]."""
        self._num_prepares += 1
        if adapter_ids is None or len(adapter_ids) == 0 or not adapter_ids.any():
            self.batch_ref.batch = None
            self._step_adapter_ids = ()
            return
        adapter_ids = np.asarray(adapter_ids, dtype=np.int64)
        step_ids = np.unique(adapter_ids[adapter_ids != 0])
        if len(step_ids) > self.max_loras:
            raise RuntimeError(f"internal: a step has {len(step_ids)} adapters but max_loras is {self.max_loras}")
        self._step_adapter_ids = tuple(int(a) for a in step_ids)
        step_slots = np.array([self._slot_for(int(aid), step_ids) for aid in step_ids], dtype=np.int32)
        seq_slot = np.full(len(adapter_ids), -1, dtype=np.int32)          # [num_seqs]
        adapted = adapter_ids != 0
        seq_slot[adapted] = step_slots[np.searchsorted(step_ids, adapter_ids[adapted])]
        token_slot = np.repeat(seq_slot, np.diff(query_start_loc))        # [num_tokens]
        rows = np.flatnonzero(token_slot >= 0)
        rows = rows[np.argsort(token_slot[rows], kind="stable")]           # grouped by slot
        sorted_slots = token_slot[rows]
        starts = np.flatnonzero(np.diff(sorted_slots)) + 1
        segment_starts = np.concatenate(([0], starts, [len(rows)])).astype(np.int32)
        self.batch_ref.batch = LoRABatch(
            token_indices=torch.from_numpy(rows.astype(np.int32)),
            segment_slots=torch.from_numpy(np.ascontiguousarray(sorted_slots[segment_starts[:-1]], dtype=np.int32)),
            segment_starts=torch.from_numpy(segment_starts))

    def clear_step(self) -> None:
        self.batch_ref.batch = None

    def _slot_for(self, aid: int, step_ids: np.ndarray) -> int:
        """The slot holding adapter aid, filling the least recently used slot no adapter of this step needs."""
        if aid in self._slot_ids:
            slot = self._slot_ids.index(aid)
        else:
            free = [s for s, held in enumerate(self._slot_ids) if held == 0 or held not in step_ids]
            slot = min(free, key=lambda s: (self._slot_ids[s] != 0, self._slot_last_used[s]))
            request = self._by_id.get(aid)
            if request is None:
                raise RuntimeError(f"internal: a step runs adapter id {aid}, which is not known")
            adapter = self._load(request)
            for name, layer in self.layers.items():
                layer.set_slot(slot, adapter.layers.get(name))
            self._slot_ids[slot] = aid
        self._slot_last_used[slot] = self._num_prepares
        return slot
