"""The page on synthetic traces (no model, no engine): a pool of thousands of blocks folds its free runs
and still draws every block in use; the step explanation reads the events in words; "pause on" stops at
a preemption; fields other features put on a record (drafted/accepted tokens, adapters, forks with
copy-on-write) appear when present and nothing breaks when they are absent."""

import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI

from pagedcore.simulator.kv_state import KVState, new_seq
from pagedcore.simulator.router import simulator_router

from .conftest import free_port
from .test_browser import is_dark
from .test_default_server import CELL_PIXEL

pytestmark = pytest.mark.browser
# Two animation frames: the page renders what a click changed on the next one.
FRAME = "() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))"

CONFIG = {"num_gpu_blocks": 6000, "num_cpu_blocks": 0, "block_size": 16, "max_num_batched_tokens": 512,
          "max_num_seqs": 8, "max_model_len": 4096, "enable_prefix_caching": True, "enable_chunked_prefill": True,
          "preemption_mode": "recompute", "policy": "fcfs", "model": "synthetic", "num_speculative_tokens": 3}


@pytest.fixture(scope="module")
def page_server():
    """The simulator's routes alone (no engine): the page and its files."""
    app = FastAPI()
    app.include_router(simulator_router(None, None))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the page server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def seq(request_id, prompt, status, table, **extra):
    s = new_seq(request_id, prompt, 0.0)
    s.update(status=status, block_table=table, num_tokens=prompt + 1, num_computed_tokens=prompt, **extra)
    return s


def synthetic_trace() -> list[dict]:
    """Three requests scattered over a 6,000-block pool: a shared prefix (B10, B11), a fork that
    copies on write, an adapter, a speculative step, then a preemption."""
    snap = KVState(CONFIG).snapshot()
    step1 = {"kind": "step", "step": 1, "time": 1.0, "num_tokens": 70, "num_prefill_tokens": 70, "num_decode_tokens": 0,
             "num_seqs": 2, "num_context_tokens": 70,
             "scheduled": [[0, 40, 0, 0, 41], [1, 30, 32, 0, 63]],
             "tables": {"0": [0, 10, 11, 2500], "1": [0, 10, 11, 5990]},
             "blocks": [[10, 2, 0, 1], [11, 2, 0, 1], [2500, 1, 0, 0], [5990, 1, 1, 0]],
             "cpu_blocks": [],
             "seqs": {"0": seq("req-a", 40, "running", [10, 11, 2500], lora_name="sql-adapter"),
                      "1": seq("req-b", 62, "running", [10, 11, 5990])},
             "queues": {"running": {"ids": [0, 1]}},
             "kv": {"usage": 0.0007, "num_free_blocks": 5996, "num_cached_free_blocks": 0, "num_free_cpu_blocks": 0,
                    "prefix_query_tokens": 62, "prefix_hit_tokens": 32, "num_preemptions": 0, "num_evictions": 0},
             "events": {"allocated": [[10, 0], [11, 0], [2500, 0], [5990, 1]], "prefix_hits": [[10, 1, 2], [11, 1, 2]],
                        "registered": [10, 11]},
             "preempted": [], "finished": []}
    step2 = {"kind": "step", "step": 2, "time": 2.0, "num_tokens": 6, "num_prefill_tokens": 6, "num_decode_tokens": 0,
             "num_seqs": 2, "num_context_tokens": 110,
             "scheduled": [[0, 4, 40, 3, 44], [1, 2, 62, 3, 64]],
             "spec": {"num_draft_tokens": 4, "num_accepted_tokens": 3, "num_generated_tokens": 5,
                      "seqs": [[0, 3, 2], [1, 1, 1]]},
             "tables": {"2": [0, 10, 11, 3000]},
             "blocks": [[10, 3, 0, 1], [11, 3, 0, 1], [3000, 1, 2, 0]], "cpu_blocks": [],
             "seqs": {"2": seq("req-b", 62, "running", [10, 11, 3000])},
             "queues": {"running": {"ids": [0, 1, 2]}},
             "kv": {"usage": 0.001, "num_free_blocks": 5995, "num_cached_free_blocks": 0, "num_free_cpu_blocks": 0,
                    "prefix_query_tokens": 62, "prefix_hit_tokens": 32, "num_preemptions": 0, "num_evictions": 0},
             "events": {"forks": [[2, 1]], "cow": [[5990, 3000, 2]], "allocated": [[3000, 2]]},
             "preempted": [], "finished": []}
    step3 = {"kind": "step", "step": 3, "time": 3.0, "num_tokens": 2, "num_prefill_tokens": 0, "num_decode_tokens": 2,
             "num_seqs": 2, "num_context_tokens": 110,
             "scheduled": [[0, 1, 44, 1, 46], [1, 1, 64, 1, 66]],
             "tables": {"2": [0]},
             "blocks": [[10, 2, 0, 1], [11, 2, 0, 1], [3000, 0, -1, 0]], "cpu_blocks": [],
             "seqs": {"2": dict(seq("req-b", 62, "waiting", []), num_preemptions=1)},
             "queues": {"running": {"ids": [0, 1]}, "waiting": {"ids": [2]}},
             "kv": {"usage": 0.0008, "num_free_blocks": 5996, "num_cached_free_blocks": 0, "num_free_cpu_blocks": 0,
                    "prefix_query_tokens": 62, "prefix_hit_tokens": 32, "num_preemptions": 1, "num_evictions": 0},
             "events": {"freed": [[10, 2, 2], [11, 2, 2], [3000, 2, 0]]},
             "preempted": [[2, "recompute"]], "finished": []}
    return [snap, step1, step2, step3]


def test_thousands_of_blocks_fold_and_every_block_in_use_is_drawn(page_server, open_page):
    page = open_page(page_server + "/")
    page.js("(t) => PC.app.loadRecords(t, 'synthetic')", synthetic_trace())
    page.page.click("#btn-step")
    page.js(FRAME)
    page.page.click("#btn-step")
    page.js(FRAME)
    layout = page.js("({folded: PC.grids.gpu.layout.folded, cell: PC.grids.gpu.layout.cell, "
                     "items: PC.grids.gpu.layout.items.length})")
    assert layout["folded"] and layout["cell"] >= 14 and layout["items"] < 40, layout
    for b in (10, 11, 2500, 3000, 5990):
        cell = page.js(CELL_PIXEL, b)
        assert not cell["gap"] and not is_dark(cell["rgb"]), (b, cell)
    assert page.js(CELL_PIXEL, 4000)["gap"]                    # a free block far from the action: folded
    # Each request in its colour: req-a's and req-b's blocks differ in hue.
    assert page.js(CELL_PIXEL, 2500)["rgb"] != page.js(CELL_PIXEL, 5990)["rgb"]
    # The minimap strip draws the whole pool: lit columns where blocks 2500 and 5990 sit.
    lit = page.js("""() => { const c = document.getElementById('gpu-minimap'), d = c.getContext('2d')
        .getImageData(0, 0, c.width, c.height).data, cols = [];
      for (let x = 0; x < c.width; x++) {
        const i = (1 * c.width + x) * 4;
        if (Math.max(d[i], d[i + 1], d[i + 2]) > 110) cols.push(x / c.width);
      }
      return cols; }""")
    assert any(abs(x - 2500 / 6000) < 0.01 for x in lit) and any(abs(x - 5990 / 6000) < 0.01 for x in lit)
    page.screenshot("simulator-synthetic-6000-blocks.png")
    assert page.errors == []


def test_the_step_is_explained_and_features_appear_when_present(page_server, open_page):
    page = open_page(page_server + "/")
    page.js("(t) => PC.app.loadRecords(t, 'synthetic')", synthetic_trace())
    page.page.click("#btn-step")
    page.js(FRAME)
    text = page.page.inner_text("#step-explain")
    assert "Prefix cache: 1 sequence found 2 blocks" in text and "32 tokens of prefill saved" in text
    assert "Admitted" not in text or "prefill" in text
    page.page.click("#btn-step")
    page.js(FRAME)
    text = page.page.inner_text("#step-explain")
    assert "Speculative decoding: 4 draft tokens verified, 3 accepted (75%)" in text
    assert "Fork: seq 2 (req-b) branched from seq 1 (req-b)" in text
    assert "Copy-on-write: seq 2 (req-b) is about to write into B5990" in text and "B3000" in text
    assert "Adapters (LoRA) in this batch: sql-adapter ×1, base model ×1" in text
    assert "SPEC_DECODE num_draft_tokens 4" in page.page.inner_text("#step-log")
    page.js("() => PC.app.select(0)")
    page.js(FRAME)
    assert "lora_name sql-adapter" in page.page.inner_text("#block-table")
    assert page.page.locator("#queues .req .lora").count() == 1
    assert "num_speculative_tokens" in page.page.inner_text("#config-chips")
    page.page.click("#btn-step")
    page.js(FRAME)
    text = page.page.inner_text("#step-explain")
    assert "Preempted: seq 2 (req-b) by recompute" in text and "no free block" in text
    assert "Freed: seq 2 (req-b) released 3 blocks: 1 back on the free list; 2 still used by other sequences" in text
    assert "Waiting: 1 request" in text and "a step that preempts admits nothing new" in text
    assert page.errors == []


def test_pause_on_preemption_stops_at_that_step(page_server, open_page):
    page = open_page(page_server + "/")
    page.page.check("#pause-preempt")
    page.js("(t) => PC.app.loadRecords(t, 'synthetic')", synthetic_trace())
    page.page.select_option("#speed", "100")
    page.page.click("#btn-play")
    page.wait_for("() => !PC.feed.playing", 10)
    assert page.js("PC.state.step") == 3 and page.js("PC.feed.pausedBy.step") == 3
    assert "paused at step 3: preemption of seq 2" in page.page.inner_text("#source-status")
    page.page.uncheck("#pause-preempt")
    page.js("() => localStorage.clear()")


def test_records_without_the_optional_fields_show_none_of_them(page_server, open_page):
    page = open_page(page_server + "/")
    trace = synthetic_trace()
    del trace[2]["spec"]
    trace[1]["seqs"]["0"].pop("lora_name")
    page.js("(t) => PC.app.loadRecords(t, 'synthetic')", trace)
    page.page.click("#btn-end")
    page.js(FRAME)
    page.page.click("#btn-step")
    page.js(FRAME)
    page.js("() => PC.feed.seekStep(2)")
    page.js(FRAME)
    text = page.page.inner_text("#step-explain")
    assert "Speculative" not in text and "Adapters" not in text
    assert page.page.locator("#queues .req .lora").count() == 0
    assert page.errors == []
