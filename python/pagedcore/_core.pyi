"""Typed stub of the C++ extension pagedcore._core (block pool, scheduler, CPU kernels, CUDA kernels when built)."""

import enum
from typing import Callable, Optional, Sequence

import numpy as np
import numpy.typing as npt

has_cuda: bool
NULL_BLOCK: int   # -1: padding in block tables
PAD_SLOT: int     # -1: padding in slot_mapping

def cuda_device_count() -> int: ...

class PreemptionMode(enum.Enum):
    RECOMPUTE = 0
    SWAP = 1

class SchedulingPolicy(enum.Enum):
    FCFS = 0
    PRIORITY = 1

class SeqStatus(enum.Enum):
    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FINISHED = 3

class FinishReason(enum.Enum):
    NONE = 0
    STOP = 1
    LENGTH = 2
    ABORT = 3

class TraceEventType(enum.Enum):
    ALLOCATE = 0
    FREE = 1
    PREFIX_HIT = 2
    COPY_ON_WRITE = 3
    SWAP_OUT = 4
    SWAP_IN = 5
    EVICT = 6
    PREEMPT = 7
    QUEUE_MOVE = 8
    FINISH = 9
    REJECT = 10
    SCHEDULE = 11
    FORK = 12
    CACHE_REGISTER = 13

class BlockPool:
    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = False) -> None: ...
    num_blocks: int
    block_size: int
    num_free_blocks: int
    num_used_blocks: int
    num_cached_blocks: int
    num_cached_free_blocks: int
    num_evictions: int
    def allocate(self, owner: int = -1) -> int: ...
    def retain(self, block_id: int) -> None: ...
    def release(self, block_id: int, owner: int = -1) -> None: ...
    def ref_count(self, block_id: int) -> int: ...
    def is_free(self, block_id: int) -> bool: ...
    def free_block_ids(self) -> list[int]: ...

class SchedulerConfig:
    def __init__(self, *, num_gpu_blocks: int, num_cpu_blocks: int = 0, block_size: int = 16,
                 max_num_batched_tokens: int = 2048, max_num_seqs: int = 256, max_model_len: int = 2048,
                 enable_prefix_caching: bool = True, enable_chunked_prefill: bool = True,
                 preemption_mode: PreemptionMode = ..., policy: SchedulingPolicy = ...,
                 enable_trace: bool = False, max_loras: int = 0) -> None: ...
    num_gpu_blocks: int
    num_cpu_blocks: int
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    preemption_mode: PreemptionMode
    policy: SchedulingPolicy
    enable_trace: bool
    max_loras: int                               # distinct LoRA adapters per step (0: no cap)

class SchedulerOutput:
    """One step's schedule. Arrays are zero-copy views that keep this object alive."""
    step_id: int
    num_seqs: int
    num_tokens: int
    max_num_blocks_per_seq: int
    max_query_len: int
    max_seq_len: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_draft_tokens: int                        # drafts verified this step (counted in num_prefill_tokens)
    num_samples: int
    num_logits: int
    seq_ids: npt.NDArray[np.int64]               # [num_seqs] batch order
    num_scheduled_tokens: npt.NDArray[np.int32]  # [num_seqs]
    num_computed_tokens: npt.NDArray[np.int32]   # [num_seqs] before this step
    query_start_loc: npt.NDArray[np.int32]       # [num_seqs + 1]
    seq_lens: npt.NDArray[np.int32]              # [num_seqs] after this step
    adapter_ids: npt.NDArray[np.uint64]          # [num_seqs] LoRA adapter of each sequence (0: base)
    block_tables: npt.NDArray[np.int32]          # [num_seqs, max_num_blocks_per_seq], -1 padded
    input_ids: npt.NDArray[np.int64]             # [num_tokens]
    positions: npt.NDArray[np.int64]             # [num_tokens]
    slot_mapping: npt.NDArray[np.int64]          # [num_tokens], -1 = padding
    # Logits rows (cpp/core/scheduler_output.h draws the layout): a sampled sequence with k drafts has
    # k + 1 rows, the last k + 1 rows of its query; rows of sample i are
    # logits_indices[logits_start_loc[i]:logits_start_loc[i + 1]]. Without drafts: one row each.
    num_logits_rows: npt.NDArray[np.int32]       # [num_seqs] k + 1 when sampled, else 0
    sample_seq_ids: npt.NDArray[np.int64]        # [num_samples]
    logits_start_loc: npt.NDArray[np.int32]      # [num_samples + 1]
    logits_indices: npt.NDArray[np.int64]        # [num_logits]
    blocks_to_copy: npt.NDArray[np.int32]        # [n, 2] (src, dst)
    blocks_to_swap_out: npt.NDArray[np.int32]    # [n, 2] (device, cpu)
    blocks_to_swap_in: npt.NDArray[np.int32]     # [n, 2] (cpu, device)
    preempted_seq_ids: npt.NDArray[np.int64]     # [num_preempted]
    events: npt.NDArray[np.int64]                # [num_events, 4] (type, seq_id, a, b)

class UpdateResult:
    finished_seq_ids: npt.NDArray[np.int64]      # [num_finished]
    finish_reasons: npt.NDArray[np.int32]        # [num_finished] FinishReason values
    stop_token_ids: npt.NDArray[np.int32]        # [num_finished], -1 unless stopped by a token
    events: npt.NDArray[np.int64]                # [num_events, 4]

class SchedulerStats:
    num_waiting: int
    num_running: int
    num_swapped: int
    num_free_blocks: int
    num_cached_free_blocks: int
    num_free_cpu_blocks: int
    kv_cache_usage: float
    prefix_query_tokens: int
    prefix_hit_tokens: int
    num_preemptions: int
    num_evictions: int
    num_steps: int

class SequenceInfo:
    seq_id: int
    status: SeqStatus
    finish_reason: FinishReason
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int
    num_draft_tokens: int                        # trailing tokens that are drafts awaiting verification
    num_preemptions: int
    adapter_id: int                               # LoRA adapter (0: base model)
    block_table: list[int]
    num_tokens: int
    num_output_tokens: int

class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None: ...
    config: SchedulerConfig
    gpu_pool: BlockPool
    cpu_pool: BlockPool
    def add_sequence(self, seq_id: int, prompt_token_ids: Sequence[int] | npt.ArrayLike, *, max_tokens: int = 16,
                     min_tokens: int = 0, ignore_eos: bool = False, eos_token_ids: Sequence[int] = (),
                     stop_token_ids: Sequence[int] = (), priority: int = 0, adapter_id: int = 0,
                     cache_salt: int = 0) -> None:
        """adapter_id (LoRA) and cache_salt are both part of every block hash: a prefix-cache hit needs both equal."""
    def fork_sequence(self, parent_id: int, child_id: int, last_token_id: int = -1) -> None: ...
    def append_tokens(self, seq_id: int, token_ids: Sequence[int] | npt.ArrayLike, *, draft: bool = False) -> None:
        """draft=True: proposals to verify; the step computing them yields num_draft_tokens + 1 logits rows."""
    def remove_tail_tokens(self, seq_id: int, num_tokens: int) -> None:
        """Inverse of append_tokens: drops appended tokens without KV (never the prompt, never the next to compute)."""
    def set_draft_tokens(self, seq_id: int, token_ids: Sequence[int] | npt.ArrayLike) -> None:
        """New values for the sequence's drafts (one each), also while a step is in flight (multi-step)."""
    def abort_sequence(self, seq_id: int) -> bool: ...
    def schedule(self) -> SchedulerOutput: ...
    def update(self, sampled_token_ids: Sequence[int] | npt.ArrayLike, forks: Optional[npt.ArrayLike] = None, *,
               num_accepted_tokens: Optional[Sequence[int] | npt.ArrayLike] = None) -> UpdateResult:
        """One token per sample row, or with num_accepted_tokens ([num_samples], each 0..num_logits_rows) the
        accepted tokens of every sample row concatenated; unconfirmed drafts are rolled back and stops are
        checked at every accepted token. forks: int [n, 3] rows (parent_id, child_id, token_id) for n > 1."""
    def cancel_step(self) -> None: ...
    step_in_flight: bool
    def has_unfinished(self) -> bool: ...
    def num_cached_prefix_tokens(self, prompt_token_ids: Sequence[int] | npt.ArrayLike, *, adapter_id: int = 0,
                                 cache_salt: int = 0) -> int:
        """Prompt tokens (whole blocks, never the last) the prefix cache holds under (adapter_id, cache_salt);
        read-only (the data-parallel router's probe; safe from another thread: no method releases the GIL)."""
    def get_sequence(self, seq_id: int) -> Optional[SequenceInfo]: ...
    def stats(self) -> SchedulerStats: ...
    def waiting_ids(self) -> list[int]: ...
    def running_ids(self) -> list[int]: ...
    def swapped_ids(self) -> list[int]: ...

# ---- CPU kernel settings (cpp/kernels/cpu_isa.h, parallel.h): one ISA for every CPU kernel ----
def kernel_isa() -> str:
    """The ISA every CPU kernel uses unless a call names one: one of kernel_isa_names()."""
def set_kernel_isa(name: str) -> bool:
    """Selects the active ISA (tests, benchmarks); False if this CPU or build lacks it, ValueError if unknown."""
def kernel_isa_names() -> list[str]:
    """generic, generic16, avx2, avx512, avx512_bf16, generic16_bf16, avx512_vnni, amx_bf16, amx_int8: a
    kernel entry's isa code is the index here (-1: the active ISA); avx512_vnni runs the quantized linear
    kernels' vpdpbusd path (never the active ISA); amx_* are not built yet."""
def kernel_isa_supported(name: str) -> bool: ...
def kernel_threading() -> str:
    """openmp (shares torch's runtime) or pool."""
def set_kernel_threading(name: str) -> None: ...
def kernel_max_threads() -> int: ...

# ---- CPU attention (raw-pointer entries: call pagedcore.ops.attention instead, which checks the tensors) ----
def reshape_and_cache_cpu(key: int, value: int, key_cache: int, value_cache: int, slot_mapping: int,
                          num_tokens: int, num_kv_heads: int, head_size: int, num_blocks: int, block_size: int,
                          key_stride_token: int, key_stride_head: int, value_stride_token: int,
                          value_stride_head: int, src_dtype: int, cache_dtype: int) -> None: ...
def paged_attention_cpu(out: int, query: int, key_cache: int, value_cache: int, block_tables: int, seq_lens: int,
                        query_start_loc: int, num_seqs: int, num_tokens: int, num_heads: int, num_kv_heads: int,
                        head_size: int, num_blocks: int, block_size: int, max_blocks_per_seq: int,
                        q_stride_token: int, q_stride_head: int, out_stride_token: int, out_stride_head: int,
                        q_dtype: int, cache_dtype: int, scale: float, max_query_len: int,
                        max_seq_len: int) -> None: ...
def copy_blocks_cpu(src: int, dst: int, block_mapping: int, num_pairs: int, num_planes: int, src_num_blocks: int,
                    dst_num_blocks: int, block_bytes: int) -> None: ...
def set_attention_tuning(max_tile_rows: int = 0, min_partition_keys: int = 0, items_per_thread: int = 0) -> None: ...
def advise_huge_pages(ptr: int, num_bytes: int) -> int:
    """madvise(MADV_HUGEPAGE) over the whole 2 MB pages of the range; the bytes advised (0 where not possible)."""

# ---- CPU linear layers (cpp/kernels/linear.h; call pagedcore.ops.linear instead) ----
class WeightFormat(enum.Enum):
    """How a linear layer's weight [N, K] is stored: dense, int8 per channel (with weight_scales) or GGUF
    blocks in ggml's byte layout (pagedcore.ops.quant_linear builds the quantized ones)."""
    DENSE_F32 = 0
    DENSE_BF16 = 1
    INT8_PER_CHANNEL = 2
    Q4_0 = 3
    Q4_1 = 4
    Q8_0 = 5
    Q4_K = 6
    Q5_K = 7
    Q6_K = 8
    Q4_0X16 = 9
    Q4_1X16 = 10
    Q8_0X16 = 11
    Q4_KX16 = 12
    Q5_KX16 = 13
    Q6_KX16 = 14
    F32X16 = 15
    BF16X16 = 16
    INT8_PER_CHANNEL_X16 = 17
    DENSE_F16 = 18  # IEEE fp16 weights (a held GPTQ / AWQ head or table), fp32 x
    F16X16 = 19
    FP8_E4M3 = 20  # OCP e4m3 bytes [N, K] with fp32 weight_scales [N]: W8A16, x fp32 (or bf16, widened)
    FP8_E4M3X16 = 21  # the same bytes as [N/16][K][16] (N a multiple of 16)
    Q5_0 = 22
    Q5_1 = 23
    Q5_0X16 = 24
    Q5_1X16 = 25

class LinearHandle:
    """One layer's weight-side arguments, bound once; dtype codes as pagedcore.ops.dtypes, epilogue 0 (none)
    or 1 (SiLU-and-multiply of gate rows then up rows), isa an index of kernel_isa_names() or -1 (active);
    weight_scales: fp32 [N] per-row scales of an INT8_PER_CHANNEL or FP8_E4M3 weight (0 otherwise);
    weight_block_scales: fp32 [N / 16, ceil(K / weight_block_k)] block-wise scales of an FP8_E4M3X16 weight (0:
    none; weight_scales then unused)."""
    def __init__(self, *, weight: int, bias: int, N: int, K: int, x_dtype: int, weight_format: WeightFormat,
                 bias_dtype: int, out_dtype: int, epilogue: int, isa: int = -1, weight_scales: int = 0,
                 weight_block_scales: int = 0, weight_block_k: int = 0) -> None: ...
    def __call__(self, out: int, x: int, M: int, x_stride: int, out_stride: int) -> None:
        """out[M, :] = epilogue(x[M, K] . W^T + bias) (raw pointers; checked by the caller)."""
def set_linear_tuning(n_chunk: int = 0, m_chunk: int = 0) -> None: ...
def quant_kernel_isa_for(weight_format: WeightFormat, isa: int = -1) -> str | None:
    """The ISA whose quantized kernels run weight_format for isa (-1: the active one), or None."""
def dense_kernel_isa_for(weight_format: WeightFormat, isa: int = -1) -> str | None:
    """The ISA whose dense kernels run weight_format for isa (-1: the active one), or None."""
def has_embedding_rows(weight_format: WeightFormat) -> bool:
    """Whether embedding_rows_cpu decodes tables of weight_format."""
def embedding_rows_cpu(out: int, table: int, ids: int, num_ids: int, num_rows: int, K: int, out_stride: int,
                       weight_format: WeightFormat, out_dtype: int) -> None:
    """Raw-pointer entry of pagedcore.ops.embedding_rows.embedding_rows (call that instead)."""
def linear_read_probe(data: int, bytes: int, threads: int, isa: int = -1) -> float:
    """Streams bytes from data on threads threads (the bandwidth probe of bench/bench_decode.py)."""

# ---- multi-LoRA (cpp/kernels/lora_kernel.h; call pagedcore.lora.kernel.lora_shrink_expand instead) ----
def lora_shrink_expand_cpu(x: int, y: int, a_t: int, b_t: int, ranks: int, slice_starts: int, token_indices: int,
                           segment_slots: int, segment_starts: int, num_tokens: int, in_features: int,
                           out_features: int, x_stride: int, y_stride: int, num_slots: int, num_slices: int,
                           max_rank: int, num_segments: int, dtype: int, isa: int = -1) -> None: ...

# ---- CPU norms (cpp/kernels/norm.h; call pagedcore.ops.elementwise instead) ----
def rms_norm_cpu(out: int, residual: int, x: int, weight: int, rows: int, n: int, x_stride: int, out_stride: int,
                 residual_stride: int, eps: float, dtype: int, isa: int = -1) -> None: ...
def rotary_embedding_cpu(x: int, cos_sin: int, num_tokens: int, num_heads: int, head_dim: int, x_stride_token: int,
                         x_stride_head: int, cos_sin_stride: int, dtype: int, isa: int = -1) -> None: ...

# ---- every decoder layer in one call (cpp/kernels/decoder_stack.h; pagedcore.layers.decoder_stack) ----
class DecoderStack:
    def __init__(self, layer_ptrs: Sequence[Sequence[int]], hidden_size: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, intermediate_size: int, rms_norm_eps: float, attn_scale: float, dtype: int,
                 isa: int = -1, linear_formats: Sequence[Sequence[WeightFormat | None]] | None = None,
                 linear_scales: Sequence[Sequence[int]] | None = None, lora_stacks: object | None = None,
                 linear_input_perms: Sequence[Sequence[int]] | None = None,
                 linear_block_k: Sequence[Sequence[int]] | None = None,
                 linear_runs: Sequence[Sequence[Sequence[tuple[int, WeightFormat, int, int]]]] | None = None) -> None:
        """layer_ptrs: per layer, input_norm, post_norm, q_norm, k_norm, qkv, qkv_bias, o_proj, gate_up, down; per
        layer and linear (qkv, o_proj, gate_up, down): its format, scales pointer, LoRA stacks, input order, fp8
        block_k, and its weight runs after the first (weight pointer, format, scales pointer, rows)."""
    def run(self, hidden: int, residual: int, num_tokens: int, cos_sin: int, kv_cache: int, cache_dtype: int,
            num_blocks: int, block_size: int, slot_mapping: int, block_tables: int, seq_lens: int,
            query_start_loc: int, num_seqs: int, max_blocks_per_seq: int, max_query_len: int, max_seq_len: int,
            num_actual_tokens: int) -> None: ...
    profiling: bool
    def profile(self, reset: bool = False) -> dict[str, float]:
        """Seconds per op (norms, qkv, rope, cache_write, attention, o_proj, gate_up, down)."""

# ---- CUDA kernels and NCCL (present when has_cuda; call pagedcore.ops.attention_cuda / .nccl instead) ----
def reshape_and_cache_cuda(key: int, value: int, key_cache: int, value_cache: int, slot_mapping: int,
                           num_tokens: int, num_kv_heads: int, head_size: int, num_blocks: int, block_size: int,
                           key_stride_token: int, key_stride_head: int, value_stride_token: int,
                           value_stride_head: int, src_dtype: int, cache_dtype: int, stream: int) -> None: ...
def paged_attention_cuda(out: int, query: int, key_cache: int, value_cache: int, block_tables: int, seq_lens: int,
                         query_start_loc: int, num_seqs: int, num_tokens: int, num_heads: int, num_kv_heads: int,
                         head_size: int, num_blocks: int, block_size: int, max_blocks_per_seq: int,
                         q_stride_token: int, q_stride_head: int, out_stride_token: int, out_stride_head: int,
                         q_dtype: int, cache_dtype: int, scale: float, max_query_len: int, max_seq_len: int,
                         workspace: int, workspace_bytes: int, stream: int, partition_size: int,
                         prefill_impl: int, decode_impl: int) -> int:
    """0 once launched, or the workspace bytes the call needs (nothing launched) when workspace_bytes is smaller."""
def copy_blocks_cuda(kv_cache: int, block_mapping: int, block_mapping_host: int, num_pairs: int, num_planes: int,
                     num_blocks: int, block_bytes: int, stream: int) -> None: ...
def swap_blocks_cuda(src: int, dst: int, block_mapping_host: int, num_pairs: int, num_planes: int,
                     src_num_blocks: int, dst_num_blocks: int, block_bytes: int, stream: int) -> None: ...

class NcclCommunicator:
    """One rank of an NCCL group; libnccl.so.2 is loaded at run time."""
    def __init__(self, world_size: int, rank: int, unique_id: bytes, device: int, library_path: str = "") -> None: ...
    @staticmethod
    def get_unique_id(library_path: str = "") -> bytes: ...
    @staticmethod
    def nccl_version(library_path: str = "") -> int: ...
    def all_reduce(self, send: int, recv: int, count: int, dtype: int, stream: int) -> None: ...
    def destroy(self) -> None: ...
    world_size: int
    rank: int
    device: int
    destroyed: bool

# ---- shared-memory communication (cpp/distributed/; pagedcore.distributed.shm_* wrap these) ----
def shm_unlink(name: str) -> bool: ...

class ShmAllReduce:
    """One rank's end of a shared-memory all-reduce group. PeerDiedError / TimeoutError from waits."""
    @staticmethod
    def create(name: str, world_size: int, slot_bytes: int) -> None: ...
    def __init__(self, name: str, rank: int) -> None: ...
    def all_reduce(self, data: int, count: int, dtype: int, timeout_s: float = -1.0,
                   is_alive: Callable[[], bool] | None = None, spin_us: float = -1.0, isa: int = -1) -> None: ...
    def close(self) -> None: ...
    rank: int
    world_size: int
    slot_bytes: int

class ShmRing:
    """One end of a shared-memory ring (reader_index -1: the writer)."""
    @staticmethod
    def create(name: str, num_readers: int, capacity_bytes: int) -> None: ...
    def __init__(self, name: str, reader_index: int) -> None: ...
    def write(self, parts: list, timeout_s: float = -1.0, is_alive: Callable[[], bool] | None = None) -> None: ...
    def read(self, timeout_s: float = -1.0, is_alive: Callable[[], bool] | None = None) -> bytearray: ...
    def close(self) -> None: ...
    is_writer: bool
    num_readers: int
    capacity: int
