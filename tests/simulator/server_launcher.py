"""`pagedcore serve --enable-trace` with a trace file, for the browser tests:
`python -m tests.simulator.server_launcher [serve flags] --trace-file F`.

`pagedcore serve` mounts the simulator and attaches its TraceRecorder itself; where it does not take
--trace-file yet, this gives its recorder one through the seam it uses (server._trace_recorder).
"""

from __future__ import annotations

import argparse
import sys

from pagedcore.cli import main as cli_main
from pagedcore.serving import server
from pagedcore.serving.cli import add_serve_parser
from pagedcore.simulator import TraceRecorder


def serve_takes_trace_file() -> bool:
    parser = argparse.ArgumentParser()
    p = add_serve_parser(parser.add_subparsers())
    return any("--trace-file" in a.option_strings for a in p._actions)


def main(argv: list[str]) -> int:
    if "--trace-file" in argv and not serve_takes_trace_file():
        i = argv.index("--trace-file")
        trace_file = argv[i + 1]
        del argv[i:i + 2]
        server._trace_recorder = lambda args: TraceRecorder(trace_file=trace_file) if args.enable_trace else None
    return cli_main(["serve", "--enable-trace", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
