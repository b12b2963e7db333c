"""`pagedcore serve --enable-trace` with the simulator page mounted and a TraceRecorder attached, for the
browser tests: `python -m tests.simulator.server_launcher [serve flags] [--trace-file F]`.

The serving code mounts the simulator itself once it is wired; until then this wraps its two seams
(build_app and AsyncLLMEngine), and steps aside where they already carry the simulator.
"""

from __future__ import annotations

import sys

from pagedcore.serving import server
from pagedcore.simulator import TraceRecorder, simulator_router


def main(argv: list[str]) -> int:
    trace_file = None
    if "--trace-file" in argv:
        i = argv.index("--trace-file")
        trace_file = argv[i + 1]
        del argv[i:i + 2]
    recorder = TraceRecorder(trace_file=trace_file)
    build_app, async_engine_class = server.build_app, server.AsyncLLMEngine

    def build_app_with_simulator(state):
        app = build_app(state)
        if not any(getattr(r, "path", None) == "/simulator/events" for r in app.routes):
            app.include_router(simulator_router(state, recorder))
        return app

    class AsyncEngineWithRecorder(async_engine_class):
        def __init__(self, engine, *args, **kwargs):
            super().__init__(engine, *args, **kwargs)   # no request can arrive before the server is ready
            if not any(isinstance(getattr(f, "__self__", None), TraceRecorder) for f in engine.step_listeners):
                recorder.attach(self)

    server.build_app = build_app_with_simulator
    server.AsyncLLMEngine = AsyncEngineWithRecorder
    from pagedcore.cli import main as cli_main

    try:
        return cli_main(["serve", "--enable-trace", *argv])
    finally:
        recorder.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
