"""The simulator as a new user meets it: `pagedcore serve` exactly as the README starts it (the bundled
model, the default 4 GiB KV cache of ~1,450 blocks of 128 tokens, no trace flag; only the ports are free ones
so the test can run beside other servers), the page at / in headless Chromium. The page must be live without
any flag, change while a request runs, and draw that request's few blocks readably among over a thousand:
checked on the canvas pixels at each of its blocks, not just on the elements."""

import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from .conftest import free_port
from .test_browser import LIVE, is_dark

pytestmark = pytest.mark.browser

# The drawn pixel at the centre of block b's cell (or the folded run that holds it), after a render.
CELL_PIXEL = """async (b) => {
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const g = PC.grids.gpu, rect = g.cellRect(b), dpr = devicePixelRatio;
  if (!rect) return null;
  const x = rect.x + Math.min(rect.w, rect.h) / 2, y = rect.y + rect.h / 2;
  const px = g.canvas.getContext('2d').getImageData(Math.floor(x * dpr), Math.floor(y * dpr), 1, 1).data;
  return {gap: rect.gap, rgb: Array.from(px.slice(0, 3)), x: rect.x, y: rect.y, w: rect.w, h: rect.h};
}"""
MY_RUNNING_SEQ = """() => {
  for (const [sid, s] of PC.state.seqs)
    if (PC.app.mine.has(s.request_id) && s.status === 'running' && s.block_table.length) return sid;
  return null; }"""


@pytest.fixture(scope="module")
def default_server():
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="pagedcore-default-", suffix=".log", delete=False)
    exe = os.path.join(os.path.dirname(sys.executable), "pagedcore")
    proc = subprocess.Popen([exe, "serve", "--port", str(port), "--grpc-port", "0"], stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"pagedcore serve exited with {proc.returncode}:\n{log.read()}")
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("pagedcore serve was not ready after 300 s")
            time.sleep(0.3)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        os.unlink(log.name)


def test_the_default_server_is_live_and_draws_a_request_among_over_a_thousand_blocks(default_server, open_page):
    assert httpx.get(default_server + "/simulator/info", timeout=10).json()["live"] is True
    page = open_page(default_server + "/")
    page.wait_for(LIVE, 60)
    num_blocks = page.js("PC.state.config.num_gpu_blocks")
    assert num_blocks >= 1000, "the README's server should have over a thousand blocks"
    step0 = page.js("PC.state.step")

    page.page.fill("#prompt", "Write a short story about a cache that never forgets.")
    page.page.fill("#prompt-max-tokens", "64")
    page.page.click("#btn-send")
    # While the reply streams, the page follows the request: steps advance, its chip runs, blocks fill.
    page.wait_for(f"() => ({MY_RUNNING_SEQ})() !== null", 300)
    assert page.js("document.getElementById('reply').dataset.done") is None, "the request ended before the page saw it"
    assert page.js("PC.state.step") > step0
    page.page.click("#btn-pause")                  # hold the state still while it is checked
    sid = page.js(MY_RUNNING_SEQ)
    table = page.js(f"PC.state.seqs.get({sid}).block_table")
    layout = page.js("({folded: PC.grids.gpu.layout.folded, cell: PC.grids.gpu.layout.cell, "
                     "items: PC.grids.gpu.layout.items.length, height: PC.grids.gpu.layout.height})")
    # Readable cells, not specks in a dark sea: ~1,450 blocks of 128 tokens fit unfolded; a pool too large for
    # that folds its free runs (a 6,000-block pool: test_page_features.py).
    assert layout["cell"] >= 14 and layout["height"] <= 520, layout
    assert layout["folded"] or layout["items"] == num_blocks, layout
    for b in table:
        cell = page.js(CELL_PIXEL, b)
        assert cell is not None and not cell["gap"], f"block {b} of the running request is folded away"
        assert not is_dark(cell["rgb"]), f"block {b} of the running request is not drawn ({cell['rgb']})"
    chip = page.page.locator(f"#queues [data-queue=running] .req.mine[data-seq='{sid}']")
    assert chip.count() == 1
    assert "Step " in page.page.inner_text("#step-explain")

    # Hover one of its blocks: id, owner sequences, ref count, prefix cache.
    cell = page.js(CELL_PIXEL, table[0])
    box = page.page.locator("#gpu-grid").bounding_box()
    page.page.mouse.move(box["x"] + cell["x"] + cell["w"] / 2, box["y"] + cell["y"] + cell["h"] / 2)
    tip = page.page.inner_text("#tooltip")
    assert f"block {table[0]}:" in tip and "ref_count" in tip and f"seq {sid}" in tip and "prefix cache" in tip

    # Click the request: its block table is listed and its blocks framed white.
    chip.click()
    page.js("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
    assert f"B{table[0]}" in page.page.inner_text("#block-table")
    edge = page.js("""(b) => { const g = PC.grids.gpu, r = g.cellRect(b), d = devicePixelRatio;
      const px = g.canvas.getContext('2d').getImageData(Math.floor((r.x + 1.5) * d), Math.floor((r.y + r.h / 2) * d), 1, 1);
      return Array.from(px.data.slice(0, 3)); }""",
                   table[0])
    assert min(edge) > 200, f"the selected request's block is not framed white: {edge}"
    page.screenshot("simulator-default-server.png")

    page.page.click("#btn-play")
    page.wait_for("() => document.getElementById('reply').dataset.done === '1'", 600)
    page.wait_for(f"() => !PC.state.seqs.has({sid})", 60)
    for b in table:                              # its blocks are free again, or kept by the prefix cache
        assert page.js("(b) => PC.state.ref[b]", b) == 0
    assert page.errors == []
