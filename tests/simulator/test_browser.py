"""The simulator page in headless Chromium against a running server (a tiny random-weight model):
it loads cleanly, a chat request shows up in the queues with its blocks drawn, its blocks go back to
the free pool when it finishes, a workload shows prefix sharing and preemption, a replayed trace file
ends in the live state, and the policy comparison draws. Screenshots go to test-artifacts/."""

import json

import httpx
import pytest

from pagedcore.simulator.kv_state import KVState

pytestmark = pytest.mark.browser

FREE_RGB = (36, 42, 56)        # grid.js COLORS.free
# The centre-left pixel of block b's cell on the GPU grid, after two animation frames (one render).
PIXEL = """async (b) => {
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const g = PC.grids.gpu, r = g.cellRect(b), dpr = devicePixelRatio;
  const x = r.x + 4, y = r.y + r.h / 2;
  return Array.from(g.canvas.getContext('2d').getImageData(Math.floor(x * dpr), Math.floor(y * dpr), 1, 1).data.slice(0, 3));
}"""
LIVE = "() => PC.feed.mode === 'live' && PC.state.config !== null"


def is_dark(rgb) -> bool:
    """free (#242a38) and cached (owner hue at 30% lightness) are dark; allocated blocks are bright."""
    return max(rgb) < 110


def test_page_loads_live_without_console_errors(sim_server, open_page):
    page = open_page(sim_server.url + "/")
    page.wait_for(LIVE)
    assert page.js("PC.state.config.num_gpu_blocks") == 85
    assert "num_gpu_blocks" in page.page.inner_text("#config-chips")
    assert page.js(PIXEL, 0) == list(FREE_RGB) or is_dark(page.js(PIXEL, 0))
    assert page.errors == []


def test_a_chat_request_flows_through_the_queues_and_its_blocks_come_back(sim_server, open_page):
    page = open_page(sim_server.url + "/")
    page.wait_for(LIVE)
    page.page.click("#btn-pause")                 # hold the records: then walk them one step at a time
    page.page.fill("#prompt", "Hello there, how are the KV blocks today?")
    page.page.fill("#prompt-max-tokens", "24")
    page.page.click("#btn-send")
    page.wait_for("() => document.getElementById('reply').dataset.done === '1'", 60)
    assert page.js("PC.app.mine.size") == 1
    page.wait_for("() => PC.feed.pending.some((r) => (r.finished || []).some((f) => PC.app.mine.has(f.request_id)))", 30)
    # Step until the request is running with blocks.
    seen = page.js("""() => {
      for (let i = 0; i < 200; i++) {
        PC.feed.stepOnce();
        for (const [sid, s] of PC.state.seqs) {
          if (PC.app.mine.has(s.request_id) && s.status === 'running' && s.block_table.length)
            return {sid, table: s.block_table.slice(), running: PC.state.queues.running.includes(sid)};
        }
      }
      return null; }""")
    assert seen is not None and seen["running"]
    page.js("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
    chip = page.page.locator(f"#queues [data-queue=running] .req.mine[data-seq='{seen['sid']}']")
    assert chip.count() == 1
    for b in seen["table"]:
        assert page.js("(b) => PC.state.ref[b]", b) >= 1
        assert not is_dark(page.js(PIXEL, b)), f"block {b} of the running request is not drawn"
    page.screenshot("simulator-request-in-flight.png")

    page.page.click("#btn-end")                   # apply everything held: the request has finished
    assert page.js(f"PC.state.seqs.has({seen['sid']})") is False
    for b in seen["table"]:
        assert page.js("(b) => PC.state.ref[b]", b) == 0
        assert is_dark(page.js(PIXEL, b)), f"block {b} still drawn as allocated after the request finished"
    assert page.js("PC.state.stats.num_free_blocks") == 85
    page.screenshot("simulator-request-finished.png")
    assert page.errors == []


def test_a_workload_shows_prefix_sharing_and_preemption(sim_server, open_page):
    page = open_page(sim_server.url + "/")
    page.wait_for(LIVE)
    page.page.fill("#wl-n", "30")
    page.page.fill("#wl-sys", "1")
    page.page.fill("#wl-max", "16")
    page.page.click("#btn-workload")
    # A step that ran 8 or more sequences at once, from the page's step history: polling the live queues
    # missed it on a fast CPU (the tiny model's whole workload can pass between two polls).
    page.wait_for("() => PC.state.history.some((r) => r.seqs >= 8)", 30)
    page.screenshot("simulator-workload-running.png")
    page.wait_for("() => PC.state.finished.filter((f) => f.request_id.startsWith('workload-')).length >= 30", 90)
    stats = page.js("PC.state.stats")
    assert stats["prefix_hit_tokens"] > 0 and stats["num_preemptions"] > 0
    assert page.js("PC.state.history.some((r) => r.preempted > 0)")
    page.screenshot("simulator-workload-done.png")
    assert page.errors == []


def test_replaying_the_trace_file_reaches_the_live_state(sim_server, open_page):
    live = open_page(sim_server.url + "/")
    live.wait_for(LIVE)
    server_state = httpx.get(sim_server.url + "/simulator/state", timeout=10).json()
    assert not any(server_state["queues"].values()), "the engine should be idle after the other tests"
    live.wait_for("(step) => PC.state.step >= step", 10, server_state["step"])
    live_digest = live.js("PC.state.digest()")

    with open(sim_server.trace_file) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    replayed = KVState.from_snapshot(lines[0])
    for record in lines[1:]:
        replayed.apply(record)
    server_digest = KVState.from_snapshot(server_state).digest()
    assert json.loads(json.dumps(replayed.digest())) == json.loads(json.dumps(server_digest))

    replay = open_page(sim_server.url + "/")
    replay.page.set_input_files("#trace-file", sim_server.trace_file)
    replay.wait_for("() => PC.feed.mode === 'replay'")
    replay.page.click("#btn-end")
    assert replay.js("PC.state.step") == server_state["step"]
    assert replay.js("PC.state.digest()") == live_digest
    assert live_digest == json.loads(json.dumps(server_digest))
    replay.screenshot("simulator-replay.png")
    assert replay.errors == [] and live.errors == []


def test_the_policy_comparison_draws_and_a_policy_replays(sim_server, open_page):
    page = open_page(sim_server.url + "/")
    page.page.click(".tab[data-tab=compare]")
    page.page.fill("#sim-form input[name=num_requests]", "300")
    page.page.click("#btn-simulate")
    page.wait_for("() => document.querySelectorAll('#sim-table tr').length === 8", 60)
    assert page.page.locator("#sim-charts canvas").count() >= 6
    page.screenshot("simulator-compare.png")
    page.page.click("#sim-table [data-watch=static]")
    page.wait_for("() => PC.feed.mode === 'replay' && !document.getElementById('tab-engine').hidden", 60)
    page.page.select_option("#speed", "100")
    page.page.click("#btn-play")
    page.wait_for("() => PC.state.step > 50", 30)
    assert page.js("PC.state.config.model") == "simulation: static"
    page.screenshot("simulator-simulation-replay.png")
    assert page.errors == []
