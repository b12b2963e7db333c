"""(a) pagedcore vs HF transformers generate() (static batches of 32, left padding), fp32 and bf16.
    .venv/bin/python bench/compare_hf.py [--limit 32] [--rounds 1]      (the full workload takes HF ~10 min)
"""
import sys

import side_by_side

sys.argv[1:1] = ["--engines", "pagedcore", "hf", "--mode", "throughput"]
side_by_side.main()
