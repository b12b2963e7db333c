"""The plain step in one C++ call (cpp/kernels/greedy_decode.h): token table lookup, the decoder
stack, the final norm, the LM head and the argmax or the sampler (cpp/kernels/sample_rows.h), for
steps where the engine needs nothing from the logits but each sampled row's token: every sampled row
greedy or plainly sampled (temperature, top-k, top-p, min-p, seed), nothing reported or edited; the
engine decides. (Named when it did the argmax only.)

The Python path makes ~10 calls around the C++ stack and head (embedding wrapper, rotary gather,
final norm wrapper, logits wrappers, argmax wrapper, tensor wrapping of the step's arrays); this
path makes one call with the scheduler's numpy arrays. On the 2-core AMD EPYC Zen 4 that took 9.3%
(Q4_1), 5.3% (bf16) and 7.8% (fp32) off a single-stream token (in-process alternated A/B,
bench/RESULTS.md "2026-12-03 04:00-05:47"). It runs the same kernels on the same rows in
the same order, so its tokens are the Python path's, bit for bit (tests/engine/test_greedy_decode.py).

A model offers it (GreedyDecode.of) only where every piece is a C++ kernel over weights held in
place: the DecoderStack runs all layers, the token table decodes in C++ (ops/embedding_rows.py), the
head is one kernel binding (the tied table's, or lm_head's single quantized part or dense kernel),
and the model is whole (no tensor / pipeline shard). Otherwise `why_not` says why, and every step
takes the Python forward. PAGEDCORE_GREEDY_DECODE=0 turns the path off (A/B measurements).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from pagedcore import _core
from pagedcore.ops.dense_repack import X16_FORMATS, X16Weight
from pagedcore.ops import checks
from pagedcore.ops.dtypes import CPU_CACHE_DTYPE_CODES, CPU_DTYPE_CODES
from pagedcore.ops.embedding_rows import TABLE_FORMATS, table_rows
from pagedcore.sampling.logit_edits import LogitEdits
from pagedcore.sampling.logprobs import RawLogitRows
from pagedcore.sampling.row_sampling import RowSampling


def enabled() -> bool:
    return os.environ.get("PAGEDCORE_GREEDY_DECODE", "1") != "0"


def binding_key(model) -> tuple:
    """What a GreedyDecode binds, as it is now: a model rebuilds its decoder when this changes (weights
    moved or replaced, the stack rebuilt, LoRA hooks added). Calls _decoder_stack(), which refreshes
    the stack itself when the layers' weights moved."""
    inner = model.model
    if model.shard is not None or not enabled():
        return (None,)
    stack = inner._decoder_stack()
    embed = inner.embed_tokens
    head = model.lm_head.weight if model.lm_head is not None else None
    return (stack, _held_ptr(embed.weight), type(embed.weight), embed.weight.dtype, embed.block_format,
            inner.rotary_emb.cos_sin_cache.data_ptr(), inner.norm.weight.data_ptr(),
            None if head is None else (_held_ptr(head), type(head), head.dtype))


def _held_ptr(t: torch.Tensor) -> int:
    return t.held_data_ptr() if isinstance(t, X16Weight) else t.data_ptr()


class GreedyDecode:
    """The bound C++ GreedyDecoder of one model, and what it points at (kept alive, and compared at
    each step: a moved tensor means the model rebuilds this)."""

    __slots__ = ("stack", "tensors", "max_rows", "head_max_rows", "vocab_size", "_decoder")

    def __init__(self, stack, tensors: tuple[torch.Tensor, ...], decoder, max_rows: int, head_max_rows: int,
                 vocab_size: int):
        self.stack = stack          # layers.decoder_stack.DecoderStack
        self.tensors = tensors      # (table, cos_sin_cache, final norm weight, head kernel): kept alive
        self.max_rows = max_rows    # tokens a step may have (the stack's bound)
        # Sampled rows a step may have: the head's kernel bound (a dense head in the checkpoint layout
        # hands more rows to a library GEMM, other rounding: such steps take the Python path).
        self.head_max_rows = head_max_rows
        self.vocab_size = vocab_size  # the head's output width
        self._decoder = decoder     # _core.GreedyDecoder

    @classmethod
    def of(cls, model) -> tuple[GreedyDecode | None, str]:
        """(the decoder of a LlamaForCausalLM as its weights are now, "") or (None, why not)."""
        inner = model.model
        if model.shard is not None:
            return None, "a tensor- or pipeline-parallel shard"
        stack = inner._decoder_stack()
        if stack is None:
            return None, f"no decoder stack ({inner.decoder_stack_status.reason})"
        embed = inner.embed_tokens
        held = embed._held_format()
        if held is None or held not in TABLE_FORMATS:
            return None, f"a token table held as {held or 'a non-CPU tensor'} (no C++ lookup)"
        table = embed.weight.packed if held in X16_FORMATS.values() else embed.weight
        dtype = stack.dtype
        cos_sin = inner.rotary_emb.cos_sin_cache  # [max_position, head_dim]
        norm = inner.norm.weight                  # [hidden]
        if not (cos_sin.is_cpu and cos_sin.dtype is dtype and cos_sin.is_contiguous()
                and norm.dtype is dtype and norm.is_contiguous()):
            return None, "the rotary table or final norm is not a contiguous CPU tensor of the activations' dtype"
        head = (embed.head_kernel(dtype) if model.lm_head is None
                else model.lm_head.method.kernel_for(model.lm_head, dtype))
        if head is None:
            return None, "the LM head has no single kernel binding (library GEMM or several formats)"
        kernel, head_max_rows = head
        decoder = _core.GreedyDecoder(
            table=table.data_ptr(), table_rows=table_rows(table, held, embed.hidden_size),
            hidden_size=embed.hidden_size, table_format=TABLE_FORMATS[held], dtype=CPU_DTYPE_CODES[dtype],
            cos_sin_cache=cos_sin.data_ptr(), max_position=cos_sin.shape[0], final_norm=norm.data_ptr(),
            final_norm_eps=inner.norm.eps, head=kernel.handle, head_max_rows=head_max_rows)
        return cls(stack, (table, cos_sin, norm, kernel), decoder, stack.max_rows, head_max_rows,
                   kernel.N), ""

    def set_timing(self, on: bool) -> None:
        """Time the call's two parts (a benchmark aid: StepProbe; two clock reads a call)."""
        self._decoder.timing = on

    def take_seconds(self) -> tuple[float, float]:
        """(layers: lookup, rotary rows and the stack; head: final norm, LM head and argmax) seconds
        since timing was turned on or last taken."""
        return self._decoder.seconds(True)

    def takes(self, num_tokens: int, num_rows: int, kv_cache: torch.Tensor,
              sampling: RowSampling | None = None, edits: LogitEdits | None = None,
              raw: RawLogitRows | None = None) -> bool:
        """Whether this step fits (asked before anything runs: block moves, noise)."""
        if self.stack.adapter_rows_unbound():
            return False
        return (0 < num_tokens <= self.max_rows and num_rows <= min(num_tokens, self.head_max_rows)
                and kv_cache.is_cpu
                and (sampling is None or (sampling.num_rows == num_rows and sampling.vocab_size == self.vocab_size))
                and (edits is None or len(edits.repetition_penalty) == num_rows)
                and (raw is None or (tuple(raw.out.shape) == (len(raw.rows), self.vocab_size)
                                     and len(raw.rows) <= num_rows)))

    def _check_cache(self, kv_cache: torch.Tensor) -> tuple[int, int, int]:
        """-> the cache's (layer, K->V, block) strides in elements (checks.kv_cache_strides)."""
        strides = checks.kv_cache_strides(kv_cache) if kv_cache.dtype in CPU_CACHE_DTYPE_CODES else None
        if strides is None:
            raise ValueError(f"GreedyDecode: the KV cache must be a 6-D fp32/bf16/fp8 CPU tensor, contiguous or "
                             f"block-major (kv_cache.allocate), got {tuple(kv_cache.shape)} {kv_cache.dtype} "
                             f"strides {kv_cache.stride()}")
        stack = self.stack
        if kv_cache.shape[0] != stack.num_layers or kv_cache.shape[3] != stack.num_kv_heads \
                or kv_cache.shape[5] != stack.head_dim:
            raise ValueError(f"GreedyDecode: KV cache {tuple(kv_cache.shape)} does not fit the model")
        return strides

    def run_steps(self, step, kv_cache: torch.Tensor, sampling: RowSampling | None = None,
                  edits: LogitEdits | None = None, ban_steps: np.ndarray | None = None, raw=None) -> np.ndarray:
        """Several decode steps in one call (engine/multi_step.py): step's sequences each hold their next
        input then placeholders (query_start_loc); -> int64 [step.num_tokens], token query_start_loc[s] + i
        sequence s's step i as single steps would give it: its argmax, or with sampling (row s: sequence s)
        drawn from noise drawn here step by step (RowSampling.draw_step_noise); edits (row s: sequence s,
        the first step's) and ban_steps (int32 [num_seqs]: steps its min_tokens bans last) edit each step's
        logits first, advanced by the tokens chosen (cpp/kernels/multi_step_edits.h); raw (engine/multi_step.py
        RawRows): the flagged sequences' logits of every step, before any edit, copied into raw.out."""
        kv_strides = self._check_cache(kv_cache)
        if self.stack.lora_batch is not None:
            raise ValueError("GreedyDecode.run_steps: multi-step does not run an engine with LoRA enabled "
                             "(its steps take the single-step call)")
        args = (self.stack._stack, step.input_ids, step.positions, kv_cache.data_ptr(),
                CPU_CACHE_DTYPE_CODES[kv_cache.dtype], kv_cache.shape[2], kv_cache.shape[4], step.slot_mapping,
                step.block_tables, step.seq_lens, step.query_start_loc, step.max_seq_len)
        edit_args = {"kv_strides": kv_strides}
        if edits is not None:
            edit_args.update(edits=edits, ban_steps=np.asarray(ban_steps, dtype=np.int32))
        if raw is not None:
            edit_args.update(raw_seqs=raw.flags, raw_out=raw.out)
        if sampling is None:
            return self._decoder.run_steps(*args, **edit_args)
        if sampling.num_rows != len(step.seq_lens) or sampling.vocab_size != self.vocab_size:
            raise ValueError(f"GreedyDecode: sampling inputs for {sampling.num_rows} rows of a {sampling.vocab_size} "
                             f"vocabulary, the step runs {len(step.seq_lens)} sequences of {self.vocab_size}")
        return self._decoder.run_steps(*args, temperature=sampling.temperature, top_k=sampling.top_k,
                                       top_p=sampling.top_p, min_p=sampling.min_p,
                                       noise=sampling.draw_step_noise(step.query_start_loc).numpy(), **edit_args)

    def __call__(self, step, kv_cache: torch.Tensor, sampling: RowSampling | None = None,
                 edits: LogitEdits | None = None, raw: RawLogitRows | None = None) -> np.ndarray:
        """step: an engine StepInput (its numpy arrays as the scheduler made them); kv_cache [num_layers,
        2, num_blocks, num_kv_heads, block_size, head_dim], contiguous or block-major; sampling: the sampled rows'
        inputs (None: each row's argmax), whose noise is drawn here; edits: the rows' penalties, logit
        bias and min_tokens bans, applied to the logits first; raw: rows whose logits are copied into
        raw.out before any edit (logprobs). -> int64 [len(logits_indices)]."""
        kv_strides = self._check_cache(kv_cache)
        args = (self.stack._stack, step.input_ids, step.positions, kv_cache.data_ptr(),
                CPU_CACHE_DTYPE_CODES[kv_cache.dtype], kv_cache.shape[2], kv_cache.shape[4], step.slot_mapping,
                step.block_tables, step.seq_lens, step.query_start_loc, step.max_query_len, step.max_seq_len,
                step.logits_indices)
        raw_args = {"kv_strides": kv_strides}
        if raw is not None:
            raw_args.update(raw_rows=raw.rows, raw_out=raw.out.numpy())
        # This step's adapter rows (LoRAManager.prepare ran for it), which the stack adds in every layer.
        lora = dict(zip(("lora_token_indices", "lora_segment_slots", "lora_segment_starts", "lora_num_segments"),
                        self.stack.lora_args()))
        raw_args.update(lora)
        if sampling is None:
            return self._decoder.run(*args, edits=edits, **raw_args)
        if sampling.num_rows != len(step.logits_indices) or sampling.vocab_size != self.vocab_size:
            raise ValueError(f"GreedyDecode: sampling inputs for {sampling.num_rows} rows of a {sampling.vocab_size} "
                             f"vocabulary, the step samples {len(step.logits_indices)} rows of {self.vocab_size}")
        return self._decoder.run(*args, temperature=sampling.temperature, top_k=sampling.top_k,
                                 top_p=sampling.top_p, min_p=sampling.min_p, noise=sampling.draw_noise().numpy(),
                                 edits=edits, **raw_args)
