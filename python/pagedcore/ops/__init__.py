"""The tensor ops over pagedcore._core's kernels. Each checks its tensors in Python (raising with the
fix in the message) and hands pointers, sizes and strides to C++; nothing here computes in torch
except torch_linear and onednn_linear, the library GEMMs for calls too large for the linear kernel.

    attention.py       reshape_and_cache, paged_attention, copy_blocks, swap_blocks on CPU tensors
                       (CUDA tensors are handed to attention_cuda)
    attention_cuda.py  the same four on CUDA tensors, and their tuning
    nccl.py            NcclCommunicator: the tensor-parallel all-reduce
    linear.py          the linear kernel (LinearKernel, linear), max_rows, torch_linear
    linear_dispatch.py per-ISA table: the kernel's row threshold and the library GEMM above it
    onednn_linear.py   PrepackedWeight: oneDNN's GEMM (torch's mkldnn ops) on a weight reordered at load
    elementwise.py     fused residual add + RMSNorm, rotary embedding
    linear_isa.py      which instruction-set variant the CPU kernels run (one set of names for all)
    checks.py          argument checks shared by the ops
    dtypes.py          the dtype codes shared with C++

The padding sentinels are _core.PAD_SLOT and _core.NULL_BLOCK (cpp/core/common.h).
"""
