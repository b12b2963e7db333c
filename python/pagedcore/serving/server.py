"""`pagedcore serve`: one process, one engine, two front ends (OpenAI HTTP and TGIS gRPC).

Life of the process:
    bind HTTP ─▶ HTTP up (/health 503 "loading") ─▶ load model (thread) ─▶ engine thread + gRPC ─▶ ready
    SIGTERM / SIGINT ─▶ drain: /health 503, new requests 503 / UNAVAILABLE, in-flight requests finish
    (at most --shutdown-timeout s, then aborted) ─▶ listeners close ─▶ exit 0.  A second Ctrl-C exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import threading
import time

import uvicorn

from pagedcore import __version__
from pagedcore.config import EngineConfig
from pagedcore.engine.llm_engine import LLMEngine
from pagedcore.serving.async_engine import AsyncLLMEngine
from pagedcore.serving.grpc.stubs import StubsUnavailableError
from pagedcore.serving.http_app import build_app
from pagedcore.serving.http_protocol import MAX_HEADER_BYTES, HeaderDeadlineH11Protocol
from pagedcore.serving.metrics import ServerMetrics
from pagedcore.serving.state import ServerState
from pagedcore.serving.transport_args import grpc_tls_files, uvicorn_ssl_kwargs

logger = logging.getLogger("pagedcore.serve")

FATAL_EXIT_DELAY_S = 2.0   # how long /health shows 503 after the engine dies, before the process exits 1


class _Uvicorn(uvicorn.Server):
    """uvicorn, but a signal starts our drain instead of closing the listener at once: /health must
    keep answering 503 while in-flight requests finish."""

    def __init__(self, config: uvicorn.Config, on_signal):
        super().__init__(config)
        self._on_signal = on_signal
        self._signalled = False

    def handle_exit(self, sig: int, frame) -> None:   # runs in the main thread, which runs the loop
        if self._signalled:
            # A second Ctrl-C means "now". A repeated SIGTERM does not: supervisors and `timeout`
            # wrappers often send one to the process and one to its group.
            if sig == signal.SIGINT:
                logger.warning("second SIGINT: exiting now without draining")
                os._exit(1)
            logger.info("%s received again: still draining", signal.Signals(sig).name)
            return
        self._signalled = True
        self._on_signal(sig)


def bind_socket(host: str, port: int) -> socket.socket:
    """The HTTP listening socket, bound before anything slow so a port clash fails in a second."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as error:
        raise OSError(f"cannot listen for HTTP on {host}:{port} ({error.strerror or error}); is another server "
                      "running there? pick another --port") from None


def run(args: argparse.Namespace, config: EngineConfig, state: ServerState, chat_template: str | None) -> int:
    sock = bind_socket(args.host, args.port)
    return asyncio.run(_serve(args, config, state, chat_template, sock))


async def _serve(args, config: EngineConfig, state: ServerState, chat_template: str | None,
                 sock: socket.socket) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(sig: int) -> None:
        logger.info("%s received: draining (up to %.0f s for requests in flight; Ctrl-C again to exit now)",
                    signal.Signals(sig).name, args.shutdown_timeout)
        loop.call_soon_threadsafe(stop.set)

    recorder = _trace_recorder(args)
    http = _Uvicorn(uvicorn.Config(build_app(state, recorder), log_level=args.uvicorn_log_level, lifespan="off",
                                   timeout_graceful_shutdown=5, server_header=False,
                                   http=HeaderDeadlineH11Protocol, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                                   **uvicorn_ssl_kwargs(args)), on_signal)
    http_task = asyncio.create_task(http.serve(sockets=[sock]))
    host, port = sock.getsockname()[:2]
    logger.info("pagedcore %s: HTTP on %s://%s:%s (health 503 until the model is loaded)", __version__,
                "https" if uvicorn_ssl_kwargs(args) else "http", f"[{host}]" if ":" in host else host, port)

    load_task = asyncio.ensure_future(_load_in_thread(config))
    stop_task = asyncio.ensure_future(stop.wait())
    await asyncio.wait({load_task, stop_task, http_task}, return_when=asyncio.FIRST_COMPLETED)
    if not load_task.done():                 # stopped, or the HTTP server died, while loading
        http.should_exit = True
        await http_task
        return 0 if stop.is_set() else 1
    if load_task.exception() is not None:
        logger.error("could not load the model: %s", load_task.exception())
        http.should_exit = True
        await http_task
        return 1

    loaded = load_task.result()
    engines: list[LLMEngine] = loaded if isinstance(loaded, list) else [loaded]   # one per data-parallel replica
    engine = engines[0]
    _log_loaded(engine)
    if len(engines) == 1:
        async_engine = AsyncLLMEngine(engine, max_queued_requests=args.max_queued_requests)
    else:   # --data-parallel-size > 1: one endpoint, a router in front of the replicas
        from pagedcore.distributed.dp_engine import DPAsyncLLMEngine

        async_engine = DPAsyncLLMEngine(engines, max_queued_requests=args.max_queued_requests)
    dead = asyncio.Event()     # the engine became unusable: exit non-zero so a supervisor restarts us
    async_engine.on_dead = lambda error: loop.call_soon_threadsafe(dead.set)
    dead_task = asyncio.ensure_future(dead.wait())
    if recorder is not None:
        # Before the first request: the trace mirrors the cache from empty. One replica's cache only.
        recorder.attach(async_engine if len(engines) == 1 else async_engine.replicas[0])
        if len(engines) > 1:
            logger.info("the simulator page's live trace shows data-parallel replica 0 of %d", len(engines))
    state.metrics = ServerMetrics(state.model_name, lambda: async_engine.snapshot, engine.view.config.max_model_len)
    async_engine.step_hooks.append(state.metrics.on_step)
    state.attach(async_engine, chat_template, created=int(time.time()))
    grpc_server, code = await _start_grpc(args, async_engine, state), 0
    if grpc_server is False:
        stop.set()
        code = 1
    logger.info("ready: serving %s (max_model_len %d)", ", ".join(state.served_model_names), state.max_model_len)

    await asyncio.wait({stop_task, http_task, dead_task}, return_when=asyncio.FIRST_COMPLETED)
    if dead.is_set():
        # /health already answers 503 and every request was failed; stay up a moment so probes and load
        # balancers see the 503, then exit 1.
        logger.critical("the engine is unusable (%s); exiting with status 1 in %.0f s", async_engine.error,
                        FATAL_EXIT_DELAY_S)
        if grpc_server:
            await grpc_server.begin_drain()   # gRPC health NOT_SERVING too
        await asyncio.sleep(FATAL_EXIT_DELAY_S)
        code = 1
    dead_task.cancel()
    await _drain(args, state, async_engine, grpc_server or None)
    for replica in engines:
        replica.shutdown()   # stops the worker ranks of a parallel model
    http.should_exit = True
    await http_task
    if recorder is not None:
        recorder.close()
    logger.info("shut down cleanly")
    return code


def _trace_recorder(args):
    """The simulator's TraceRecorder with --enable-trace (the page's live view), else None."""
    if not args.enable_trace:
        return None
    from pagedcore.simulator import TraceRecorder   # in-tree: a broken import is a bug, not an option

    return TraceRecorder(trace_file=getattr(args, "trace_file", None))


async def _load_in_thread(config: EngineConfig) -> LLMEngine | list[LLMEngine]:
    """LLMEngine(config) (with --data-parallel-size > 1, the replicas) on a daemon thread: a signal while
    loading need not wait for it."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def load():
        try:
            if config.data_parallel_size > 1:   # the replicas' engines, a list (distributed/dp_replicas.py)
                from pagedcore.distributed.dp_replicas import load_replicas

                engine = load_replicas(config)
            else:
                engine = LLMEngine(config)
        except BaseException as error:   # noqa: BLE001 - handed to the loop, which reports it
            # Bound now: Python unbinds `error` when the except block ends, before the loop runs this.
            loop.call_soon_threadsafe(lambda e=error: future.done() or future.set_exception(e))
        else:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(engine))

    threading.Thread(target=load, name="pagedcore-load", daemon=True).start()
    return await future


def _log_loaded(engine: LLMEngine) -> None:
    view = engine.view
    config = view.config
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in view.load_seconds.items())
    logger.info("loaded %s (%s, %s, %.1fM parameters) in %.1f s (%s)", view.model_path, view.model_format,
                config.dtype, view.num_parameters / 1e6, view.startup_seconds, phases)
    logger.info("%s; max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d, prefix caching %s",
                view.kv_cache_description, config.max_model_len, config.max_num_seqs,
                config.max_num_batched_tokens, "on" if config.enable_prefix_caching else "off")


async def _start_grpc(args, async_engine: AsyncLLMEngine, state: ServerState):
    """The gRPC server, None when off or not built, False when it failed to start."""
    if not args.grpc_port:
        logger.info("gRPC disabled (--grpc-port 0)")
        return None
    try:
        from pagedcore.serving.grpc.server import start_grpc_server
    except StubsUnavailableError as error:   # only the optional case; any other import error is a bug
        logger.warning("gRPC unavailable (%s); serving HTTP only", error)
        return None
    try:
        return await start_grpc_server(async_engine, host=args.host, port=args.grpc_port, api_keys=state.api_keys,
                                       served_model_name=state.model_name, max_model_len=state.max_model_len,
                                       tls=grpc_tls_files(args))
    except Exception as error:  # noqa: BLE001 - a port clash or a bad build: say so and stop cleanly
        logger.error("could not start gRPC on port %s: %s; shutting down (use --grpc-port 0 to serve HTTP only)",
                     args.grpc_port, error)
        return False


async def _drain(args, state: ServerState, async_engine: AsyncLLMEngine, grpc_server) -> None:
    state.draining = True                         # /health 503, new HTTP requests 503
    async_engine.stop_accepting()
    if grpc_server is not None:
        await grpc_server.begin_drain()           # gRPC health NOT_SERVING, new calls UNAVAILABLE
    in_flight = async_engine.num_in_flight()
    if in_flight:
        logger.info("waiting for %d request(s) in flight", in_flight)
    await async_engine.shutdown(args.shutdown_timeout)
    if grpc_server is not None:
        await grpc_server.stop(grace=5)
