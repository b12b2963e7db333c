"""Which threads the C++ kernels run on in a process that runs a model on the CPU.

The kernels spread each call over the cores either in OpenMP parallel regions (sharing torch's one
GNU OpenMP team) or on their own small thread pool (cpp/kernels/parallel.h). The C++ library starts on
OpenMP (the pool where two OpenMP runtimes are mapped); the engine then picks per model, once its
weights are laid out for the kernels (engine/model_runner.py):

- **pool** when every linear layer runs on our kernels at every row count: quantized formats (GGUF
  blocks as stored, int8 W8A8) and dense weights repacked x16. No torch GEMM runs in a step then, and
  a parallel region on the pool costs ~0.16 us where OpenMP's cost 0.45-1.6 us (Zen 5 VM, 2026-12-04):
  a token makes ~150 of them. Measured on the Zen 5 VM (2026-12-05, Q4_1 as stored, alternated in
  fresh processes): the fixed workload 1.03x OpenMP's (pool ahead in 5 of 6 pairs), single-stream Q4_0
  decode 0.95x the time a token, 0.89x after the pool's spin fix (docs/performance.md, "The kernels' pool
  by default").
- **openmp** (the library's default) when a layer sends many-row calls to a library GEMM (torch,
  oneDNN: dense weights in the checkpoint layout, e.g. on AVX2-only CPUs or AMX): those GEMMs run on
  torch's OpenMP team, and our regions then reuse its spinning workers instead of contending with them
  (two teams on the same cores cost milliseconds a step on the AVX2 EPYC, bench/bench_attention.py).

PAGEDCORE_KERNEL_THREADING=pool|openmp overrides the choice for the whole process. The setting is
process-wide: a speculative draft's runner decides for the draft and its target together; with several
engines in one process, the one built last decides.
"""

from __future__ import annotations

import logging
import os

import torch

from pagedcore import _core

logger = logging.getLogger(__name__)

ENV_VAR = "PAGEDCORE_KERNEL_THREADING"
CHOICES = ("pool", "openmp")
# The C++ library's own choice, read before the engine changes it (openmp, or pool when two OpenMP
# runtimes are mapped or PAGEDCORE_KERNEL_THREADING says so).
LIBRARY_DEFAULT = _core.kernel_threading()


_WHY = {"pool": "every linear layer runs our kernels",
        "openmp": "library GEMMs run in steps: sharing torch's OpenMP team"}


def _env_choice() -> str | None:
    value = os.environ.get(ENV_VAR)
    if value is None or value == "":
        return None
    if value not in CHOICES:
        raise ValueError(f"{ENV_VAR}={value!r}; set 'pool' (the kernels' own threads) or 'openmp' "
                         "(torch's OpenMP team), or leave it unset for the engine's choice")
    return value


def library_gemm_layers(model: torch.nn.Module) -> list[str]:
    """Names of the linear layers whose many-row calls go to a library GEMM (torch / oneDNN): dense
    weights kept in the checkpoint layout. Quantized layers and x16-repacked dense layers run our
    kernels at every row count."""
    from pagedcore.layers.linear import DenseLinearMethod, Linear
    from pagedcore.ops.dense_repack import X16Weight

    return [name for name, module in model.named_modules()
            if isinstance(module, Linear) and isinstance(module.method, DenseLinearMethod)
            and module.weight.is_cpu and not isinstance(module.weight, X16Weight)]


def choose(*models: torch.nn.Module) -> str:
    """The kernels' threading for a process that runs `models` on the CPU (see the module docstring): the
    pool only if none of them sends calls to a library GEMM."""
    forced = _env_choice()
    if forced is not None:
        return forced
    return LIBRARY_DEFAULT if any(library_gemm_layers(m) for m in models) else "pool"


def apply_for_models(*models: torch.nn.Module) -> str:
    """Sets the kernels' threading for `models` (choose) and returns it."""
    threading = choose(*models)
    if _core.kernel_threading() != threading:
        _core.set_kernel_threading(threading)
        logger.info("CPU kernels run on %s threads (%s)", threading, _WHY[threading] if _env_choice() is None
                    else ENV_VAR)
    return _core.kernel_threading()
