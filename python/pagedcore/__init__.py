"""pagedcore: a high-throughput LLM inference engine with a paged KV cache and a C++ core.

The package root exports the offline API only; everything else lives in submodules.
"""

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name):
    # Lazy, so that `import pagedcore._core` (scheduler tests, the simulator) does not load torch.
    if name == "LLM":
        from pagedcore.entrypoints.llm import LLM

        return LLM
    if name == "SamplingParams":
        from pagedcore.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'pagedcore' has no attribute {name!r}")
