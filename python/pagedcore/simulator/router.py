"""The simulator's HTTP routes: the page at `/`, its static files, the live SSE trace, the synthetic
workload button and the model-free policy comparison.

    GET  /                        the page (static/index.html)
    GET  /simulator/static/NAME   its scripts and style (shipped in the package; nothing from a CDN)
    GET  /simulator/info          what this server can show (live trace? API key needed?)
    GET  /simulator/events        SSE: a snapshot, then one record per engine step
    GET  /simulator/state         the current snapshot (JSON)
    GET  /simulator/trace.jsonl   the recorder's ring as a replayable trace
    POST /simulator/workload      N requests sharing a system prompt, through the real engine
    POST /simulator/simulate      policies compared on the real scheduler with a cost model (JSON)
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse

from pagedcore.simulator.recorder import TraceRecorder

STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")
_MEDIA_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png",
                ".svg": "image/svg+xml"}
NO_TRACE = "this server records no trace (it was started with --disable-trace): restart it without that flag"
HEARTBEAT_S = 15.0        # an SSE comment now and then keeps proxies from closing an idle stream


def simulator_router(state: Any = None, recorder: TraceRecorder | None = None) -> APIRouter:
    """Routes of the simulator page. `state` is the server's ServerState (engine, tokenizer, API keys;
    None serves replay and simulation only); `recorder` the TraceRecorder attached to its engine
    (None when the server runs with --disable-trace)."""
    from pagedcore.serving.auth import APIKeyCheck

    router = APIRouter()
    keys = list(getattr(state, "api_keys", None) or [])
    protected = [Depends(APIKeyCheck(keys))]
    static_files = {n for n in os.listdir(STATIC_DIR) if os.path.splitext(n)[1] in _MEDIA_TYPES}
    simulate_lock = asyncio.Lock()

    @router.get("/", include_in_schema=False)
    @router.get("/simulator", include_in_schema=False)
    async def page() -> Response:
        # The page's files sit beside index.html (so it also works opened as a file); served, they
        # live under /simulator/static/, which a <base> element tells the browser.
        with open(os.path.join(STATIC_DIR, "index.html"), encoding="utf-8") as f:
            html = f.read().replace("<head>", '<head>\n<base href="/simulator/static/">', 1)
        return HTMLResponse(html, headers={"Cache-Control": "no-cache"})

    @router.get("/simulator/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in static_files:
            raise HTTPException(404, f"no simulator file {name!r}")
        return FileResponse(os.path.join(STATIC_DIR, name), media_type=_MEDIA_TYPES[os.path.splitext(name)[1]],
                            headers={"Cache-Control": "no-cache"})

    @router.get("/simulator/info")
    async def info() -> dict:
        engine = getattr(state, "engine", None)
        return {"live": recorder is not None, "attached": bool(recorder and recorder.attached),
                "engine_ready": engine is not None, "api_key_required": bool(keys),
                "model": getattr(state, "model_name", None) if state is not None else None,
                "why_not_live": None if recorder is not None else NO_TRACE,
                # engine-thread seconds spent recording (bench/bench_trace.py reads it beside throughput)
                "trace_cost": None if recorder is None else
                {"num_records": recorder.num_records, "seconds": round(recorder.seconds_in_recorder, 6)}}

    @router.get("/simulator/events")
    async def events(request: Request) -> Response:
        return StreamingResponse(_event_stream(request, recorder), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @router.get("/simulator/state")
    async def snapshot() -> dict:
        return _require_attached(recorder).snapshot()

    @router.get("/simulator/trace.jsonl")
    async def trace() -> Response:
        body = _require_attached(recorder).jsonl()
        return Response(body, media_type="application/x-ndjson",
                        headers={"Content-Disposition": 'attachment; filename="pagedcore-trace.jsonl"'})

    @router.post("/simulator/workload", dependencies=protected)
    async def workload(request: Request) -> dict:
        from pagedcore.simulator.workload_launcher import launch_workload

        return await launch_workload(state, await _json_body(request))

    @router.post("/simulator/simulate", dependencies=protected)
    async def simulate(request: Request) -> Response:
        from pagedcore.simulator.comparison import run_comparison

        body = await _json_body(request)
        async with simulate_lock:   # one at a time: it is CPU work beside the engine
            try:
                result = await asyncio.get_running_loop().run_in_executor(None, run_comparison, body)
            except (ValueError, TypeError) as error:
                raise HTTPException(400, str(error)) from None
        return JSONResponse(result)

    return router


def _require_attached(recorder: TraceRecorder | None) -> TraceRecorder:
    if recorder is None:
        raise HTTPException(404, NO_TRACE)
    if not recorder.attached:
        raise HTTPException(503, "the model is still loading; the trace starts when it is ready")
    return recorder


async def _json_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"{}")
    except json.JSONDecodeError as error:
        raise HTTPException(400, f"the body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise HTTPException(400, "the body must be a JSON object")
    return body


def _sse(payload: str) -> bytes:
    return f"data: {payload}\n\n".encode()


async def _event_stream(request: Request, recorder: TraceRecorder | None):
    if recorder is None:
        yield _sse(json.dumps({"kind": "unavailable", "message":
                               NO_TRACE + "; the page can still replay a trace file and run simulations"}))
        return
    while not recorder.attached:            # the model is loading
        yield _sse(json.dumps({"kind": "loading"}))
        await asyncio.sleep(1.0)
    sub, snap = recorder.subscribe(asyncio.get_running_loop())
    try:
        yield _sse(json.dumps(snap, separators=(",", ":")))
        while True:
            try:
                await asyncio.wait_for(sub.wakeup.wait(), HEARTBEAT_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return
                yield b": heartbeat\n\n"
                continue
            lines = recorder.drain(sub)
            if lines:
                yield b"".join(_sse(line) for line in lines)
    finally:
        recorder.unsubscribe(sub)
