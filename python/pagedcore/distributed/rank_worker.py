"""RankWorker: what one model rank does, in a worker process (mp) or a Ray actor (H4 wraps it).

It holds one shard of the weights (its heads / columns / vocabulary rows of its pipeline stage's
layers) and the same shard of every KV block, and for each step: applies the step's block moves to
its cache, runs its stage over the step's micro-batches, and (on the last stage) returns its
vocabulary slice of the logits. It talks only through the specs it was given (picklable), so the
same class runs under any executor.

    driver ──StepInput──▶ step channel (one put, world_size readers)
                            │ every rank: block moves on its own cache
          stage 0 ranks ────┴─ mb0 ─▶ mb1 ─▶ ...            (p, t) ──activations──▶ (p + 1, t)
          last stage ranks ───── mb0 ─▶ mb1 ─▶ merge ─▶ fp32 [rows, vocab slice] ─▶ result channel
"""

from __future__ import annotations

import logging
import os
import traceback
from dataclasses import dataclass

import numpy as np
import torch

from pagedcore.distributed import comm_spec
from pagedcore.distributed.communicator import Channel, Communicator, IsAlive
from pagedcore.distributed.errors import PeerDiedError
from pagedcore.distributed.micro_batches import merge_logits, split_step
from pagedcore.distributed.rank import ParallelLayout
from pagedcore.engine import kv_cache as kvc
from pagedcore.engine.model_runner import ModelRunner
from pagedcore.engine.step_input import StepInput
from pagedcore.layers.attention import AttentionMetadata

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankInit:
    """Everything a rank needs, picklable: it crosses a process spawn or a Ray actor call."""
    model: str | None               # HF folder / .gguf / None (the bundled default); the path each node sees
    dtype: str                      # --dtype as given (auto | float32 | bfloat16)
    quantization: str | None
    block_size: int
    rank: int
    layout: ParallelLayout
    tp_group: object                # comm spec of this rank's stage group; None when tp_size == 1
    step_channel: object            # channel spec: the driver's StepInput broadcast; reader index = rank
    result_channel: object | None   # channel spec to the driver: call replies (every mp rank), logits (last stage)
    prev_stage_channel: object | None   # activations from (pp_rank - 1, tp_rank); None on the first stage
    next_stage_channel: object | None   # activations to (pp_rank + 1, tp_rank); None on the last stage
    cores: tuple[int, ...] | None   # cores to bind to (None: leave affinity alone, e.g. on Ray)
    num_threads: int
    seed: int
    device: str = "cpu"             # cpu | cuda: a CUDA rank runs on GPU `rank` (its tp group is then NCCL)


@dataclass(frozen=True)
class RankCall:
    """A control message on the step channel: every rank runs RankWorker.<method>(*args) and replies."""
    method: str                     # load_model | init_kv_cache | memory_report | stop
    args: tuple = ()


@dataclass(frozen=True)
class RankReply:
    rank: int
    value: object


@dataclass(frozen=True)
class RankFailure:
    """A rank's last word before it exits: what raised, and where."""
    rank: int
    message: str                    # "ValueError: ..."
    traceback: str


class RankWorker:
    def __init__(self, init: RankInit, is_alive: IsAlive | None = None):
        """is_alive: False once the driver is gone (mp: the rank's parent changed); every wait checks it."""
        self.init = init
        self.layout = init.layout
        self.rank_info = init.layout.rank_info(init.rank)
        self.is_alive = is_alive
        # One GPU per rank on a CUDA run (ranks of one machine: rank r on cuda:r).
        self.device = torch.device("cuda", init.rank) if init.device.startswith("cuda") else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        torch.manual_seed(init.seed)
        comm_options = {"device": self.device} if self.device.type == "cuda" else {}
        self.tp_comm: Communicator | None = (None if init.tp_group is None else comm_spec.open_communicator(
            init.tp_group, self.rank_info.tp_rank, is_alive=is_alive, **comm_options))
        self.prev_stage: Channel | None = (None if init.prev_stage_channel is None
                                           else comm_spec.open_channel_reader(init.prev_stage_channel, 0))
        self.next_stage: Channel | None = (None if init.next_stage_channel is None
                                           else comm_spec.open_channel_writer(init.next_stage_channel))
        self.results: Channel | None = (None if init.result_channel is None
                                        else comm_spec.open_channel_writer(init.result_channel))
        self.loaded = None
        self.runner: ModelRunner | None = None

    # -- set-up --------------------------------------------------------------------------------------
    def load_model(self) -> int:
        """Loads this rank's shard. Returns its weight bytes."""
        if self.layout.world_size == 1:   # the one rank holds the whole model: the plain loader
            from pagedcore.loader import load_model

            loaded = load_model(self.init.model, dtype=self.init.dtype, load_tokenizer=False,
                                quantization=self.init.quantization)
        else:
            from pagedcore.distributed.model_shard import load_model_shard

            loaded = load_model_shard(self.init.model, self.init.dtype, self.init.quantization, self.rank_info,
                                      self.tp_comm)
        self.loaded = loaded
        if self.device.type == "cuda":
            from pagedcore.layers.held_weights import widen_held_weights

            widen_held_weights(loaded.model)  # the GPU's GEMMs take fp32 weights under fp32 activations
            loaded.model.to(self.device)
        self.runner = ModelRunner(loaded.model, self.device)
        return self.weight_bytes()

    def kv_cache_spec(self) -> kvc.KVCacheSpec:
        """This rank's KV heads and layers, in the model's activation dtype."""
        full = self.loaded.config
        config = full
        if self.layout.world_size > 1:
            from pagedcore.distributed.sharding import shard_config

            config = shard_config(full, self.rank_info)
        return kvc.KVCacheSpec.of(config, self.init.block_size, full.dtype)

    def init_kv_cache(self, num_blocks: int, num_cpu_blocks: int, background_commit: bool = False) -> int:
        """Allocates num_blocks device blocks (and num_cpu_blocks swap blocks) of this rank's shape, host
        memory committed on a thread with background_commit. Returns the device cache's bytes."""
        spec = self.kv_cache_spec()
        # [local layers, 2, num_blocks, local kv heads, block, head_dim]
        kv_cache = kvc.allocate(spec, num_blocks, self.device, background_commit=background_commit)
        cpu_kv_cache = (kvc.allocate(spec, num_cpu_blocks, "cpu", pin_memory=self.device.type == "cuda",
                                     background_commit=background_commit)
                        if num_cpu_blocks else None)
        self.runner.bind_kv_cache(kv_cache, cpu_kv_cache)
        return _nbytes(kv_cache)

    def profile_memory(self, shape: kvc.ProfileShape) -> tuple[int, int, int]:
        """A CUDA rank: a dummy forward of the largest step through a scratch cache of its shape (every
        rank of the group runs it at once, so the all-reduces pair up). Returns (the GPU's total bytes,
        the peak without the scratch cache, this rank's bytes per KV block)."""
        if self.device.type != "cuda":
            raise ValueError("memory profiling measures a CUDA device; this rank runs on the CPU")
        spec = self.kv_cache_spec()
        scratch = kvc.allocate(spec, shape.num_blocks(spec.block_size), self.device)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.runner.profile_forward(scratch, shape.num_tokens, shape.num_seqs, shape.seq_len, shape.num_logits_rows)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - _nbytes(scratch)
        del scratch
        torch.cuda.empty_cache()
        _, total = torch.cuda.mem_get_info(self.device)
        return total, peak, spec.bytes_per_block

    def weight_bytes(self) -> int:
        model = self.runner.model
        return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))

    def memory_report(self) -> dict:
        return {"weight_bytes": self.weight_bytes(), "kv_cache_bytes": _nbytes(self.runner.kv_cache),
                "swap_bytes": _nbytes(self.runner.cpu_kv_cache),
                "num_parameters": sum(p.numel() for p in self.runner.model.parameters())}

    # -- one step ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def run_step(self, step: StepInput) -> np.ndarray | None:
        """Block moves, this stage's forward over the step's micro-batches, and on the last stage the
        logits slice: fp32 [num_logits_rows, vocab slice], also put on the result channel if there is
        one. None on other stages."""
        if self.layout.pp_size == 1:
            logits = _to_numpy(self.runner.execute(step))      # fp32 [rows, vocab slice]
        else:
            logits = self._run_pipelined(step)
        if logits is not None and self.results is not None:
            self.results.put(logits, is_alive=self.is_alive)
        return logits

    def _run_pipelined(self, step: StepInput) -> np.ndarray | None:
        runner, info = self.runner, self.rank_info
        runner.move_blocks(step)       # once per step, before any micro-batch reads the cache
        if step.num_tokens == 0:
            return np.zeros((0, 0), dtype=np.float32) if info.is_last_stage else None
        pieces = split_step(step, self.layout.pp_size)
        piece_logits = []
        for piece in pieces:
            sub = piece.step
            intermediate = None
            if not info.is_first_stage:
                intermediate = _unpack(self.prev_stage.get(is_alive=self.is_alive))
            if intermediate is not None and self.device.type == "cuda":
                intermediate = type(intermediate)(*(None if t is None else t.to(self.device)
                                                    for t in (intermediate.hidden, intermediate.residual)))
            out = runner.model(runner._tensor(sub.input_ids), runner._tensor(sub.positions), runner.kv_cache,
                               attention_metadata(sub, self.device), intermediate)
            if not info.is_last_stage:
                self.next_stage.put(_pack(out), is_alive=self.is_alive)   # IntermediateTensors -> stage p + 1
                continue
            rows = sub.logits_indices                                      # int64 [piece rows]
            if len(rows) == 0:
                piece_logits.append(np.zeros((0, 0), dtype=np.float32))
                continue
            hidden = out.index_select(0, runner._tensor(rows))             # [piece rows, hidden]
            piece_logits.append(_to_numpy(runner.model.compute_logits(hidden)))
        if not info.is_last_stage:
            return None
        return merge_logits(pieces, piece_logits, len(step.logits_indices))

    # -- the process loop (mp) -------------------------------------------------------------------------
    def serve_forever(self, step_reader: Channel, is_alive: IsAlive) -> None:
        """Runs steps and calls from the step channel until told to stop or the driver is gone. A step
        or call that raises is reported on the result channel, then the rank exits non-zero: a rank
        that missed a step has a cache the others do not have, and peers may wait on it."""
        self.is_alive = is_alive if is_alive is not None else self.is_alive
        while True:
            try:
                message = step_reader.get(is_alive=is_alive)
            except PeerDiedError:
                logger.warning("rank %d: the driver is gone; exiting", self.init.rank)
                return
            try:
                if isinstance(message, StepInput):
                    self.run_step(message)
                    continue
                if message.method == "stop":
                    return
                value = getattr(self, message.method)(*message.args)
                self.results.put(RankReply(self.init.rank, value), is_alive=is_alive)
            except PeerDiedError:
                logger.warning("rank %d: a peer or the driver is gone; exiting", self.init.rank)
                return
            except BaseException as error:   # noqa: BLE001 - reported, then the process exits non-zero
                failure = RankFailure(self.init.rank, f"{type(error).__name__}: {error}", traceback.format_exc())
                logger.error("rank %d failed: %s", self.init.rank, failure.traceback)
                try:
                    self.results.put(failure, timeout=5.0, is_alive=is_alive)
                finally:
                    os._exit(1)

    def close(self) -> None:
        for end in (self.tp_comm, self.prev_stage, self.next_stage, self.results):
            if end is not None:
                end.close()


def attention_metadata(step: StepInput, device: torch.device | None = None) -> AttentionMetadata:
    """The step's batch layout as tensors: on the CPU views of its arrays (no copies), else copied to device."""
    def tensor(array):
        t = torch.from_numpy(array)
        return t if device is None or device.type == "cpu" else t.to(device, non_blocking=True)

    return AttentionMetadata(
        slot_mapping=tensor(step.slot_mapping),          # int64 [num_tokens]
        block_tables=tensor(step.block_tables),          # int32 [num_seqs, max_blocks]
        seq_lens=tensor(step.seq_lens),                  # int32 [num_seqs]
        query_start_loc=tensor(step.query_start_loc),    # int32 [num_seqs + 1]
        max_query_len=step.max_query_len, max_seq_len=step.max_seq_len)


def _to_numpy(logits: torch.Tensor) -> np.ndarray:
    return logits.detach().to("cpu", torch.float32).contiguous().numpy()


# Activations between stages travel as numpy (raw bytes under pickle protocol 5); bfloat16, which
# numpy lacks, as its int16 bit pattern.
def _pack_tensor(t: torch.Tensor | None):
    if t is None:
        return None
    t = t.contiguous().cpu()   # activations between stages travel through host shared memory
    if t.dtype == torch.bfloat16:
        return ("bfloat16", t.view(torch.int16).numpy())
    return ("", t.numpy())


def _unpack_tensor(packed) -> torch.Tensor | None:
    if packed is None:
        return None
    kind, array = packed
    t = torch.from_numpy(array)
    return t.view(torch.bfloat16) if kind == "bfloat16" else t


def _pack(intermediate) -> tuple:
    return _pack_tensor(intermediate.hidden), _pack_tensor(intermediate.residual)


def _unpack(packed: tuple):
    from pagedcore.distributed.model_shard import IntermediateTensors

    hidden, residual = packed
    return IntermediateTensors(_unpack_tensor(hidden), _unpack_tensor(residual))


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()
