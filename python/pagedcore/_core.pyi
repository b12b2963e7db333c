"""Typed stub of the C++ extension pagedcore._core (block pool, scheduler, CPU kernels)."""

import enum
from typing import Optional, Sequence

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
                 enable_trace: bool = False) -> None: ...
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
    seq_ids: npt.NDArray[np.int64]               # [num_seqs] batch order
    num_scheduled_tokens: npt.NDArray[np.int32]  # [num_seqs]
    num_computed_tokens: npt.NDArray[np.int32]   # [num_seqs] before this step
    query_start_loc: npt.NDArray[np.int32]       # [num_seqs + 1]
    seq_lens: npt.NDArray[np.int32]              # [num_seqs] after this step
    block_tables: npt.NDArray[np.int32]          # [num_seqs, max_num_blocks_per_seq], -1 padded
    input_ids: npt.NDArray[np.int64]             # [num_tokens]
    positions: npt.NDArray[np.int64]             # [num_tokens]
    slot_mapping: npt.NDArray[np.int64]          # [num_tokens], -1 = padding
    logits_indices: npt.NDArray[np.int64]        # [num_samples]
    sample_seq_ids: npt.NDArray[np.int64]        # [num_samples]
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
    num_preemptions: int
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
                     stop_token_ids: Sequence[int] = (), priority: int = 0, extra_key: int = 0) -> None: ...
    def fork_sequence(self, parent_id: int, child_id: int, last_token_id: int = -1) -> None: ...
    def append_tokens(self, seq_id: int, token_ids: Sequence[int] | npt.ArrayLike) -> None: ...
    def abort_sequence(self, seq_id: int) -> bool: ...
    def schedule(self) -> SchedulerOutput: ...
    def update(self, sampled_token_ids: Sequence[int] | npt.ArrayLike,
               forks: Optional[npt.ArrayLike] = None) -> UpdateResult:
        """forks: int [n, 3] rows (parent_id, child_id, token_id) for n > 1 sampling."""
    def cancel_step(self) -> None: ...
    step_in_flight: bool
    def has_unfinished(self) -> bool: ...
    def get_sequence(self, seq_id: int) -> Optional[SequenceInfo]: ...
    def stats(self) -> SchedulerStats: ...
    def waiting_ids(self) -> list[int]: ...
    def running_ids(self) -> list[int]: ...
    def swapped_ids(self) -> list[int]: ...

# ---- CPU kernels (raw-pointer entries: call pagedcore.kernels instead, which checks the tensors) ----
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
def kernel_isa() -> str:
    """generic, generic16, avx2 or avx512: the instruction set the CPU kernels use."""
def set_kernel_isa(name: str) -> bool: ...
def kernel_threading() -> str:
    """openmp (shares torch's runtime) or pool."""
def set_kernel_threading(name: str) -> None: ...
def kernel_max_threads() -> int: ...
def set_attention_tuning(max_tile_rows: int = 0, min_partition_keys: int = 0, items_per_thread: int = 0) -> None: ...
def advise_huge_pages(ptr: int, num_bytes: int) -> int:
    """madvise(MADV_HUGEPAGE) over the whole 2 MB pages of the range; the bytes advised (0 where not possible)."""

# ---- CUDA kernels and NCCL (present when has_cuda; call pagedcore.kernels / kernels_cuda instead) ----
def reshape_and_cache_cuda(*args: int) -> None: ...
def paged_attention_cuda(*args: int | float) -> None: ...
def copy_blocks_cuda(*args: int) -> None: ...
def swap_blocks_cuda(*args: int) -> None: ...

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
