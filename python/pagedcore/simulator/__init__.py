"""The live engine simulator: per-step engine traces (trace.py, recorder.py), the page that draws them
(static/, router.py) and the model-free simulation of scheduling policies (simulation.py, cli.py).

    from pagedcore.simulator import TraceRecorder, simulator_router
"""

__all__ = ["StepTracer", "TraceRecorder", "simulator_router"]


def __getattr__(name):
    # Lazy: the simulation and trace replay need neither FastAPI nor torch.
    if name == "StepTracer":
        from pagedcore.simulator.trace import StepTracer

        return StepTracer
    if name == "TraceRecorder":
        from pagedcore.simulator.recorder import TraceRecorder

        return TraceRecorder
    if name == "simulator_router":
        from pagedcore.simulator.router import simulator_router

        return simulator_router
    raise AttributeError(f"module 'pagedcore.simulator' has no attribute {name!r}")
