"""(c) pagedcore vs llama.cpp (llama-cpp-python on the Q4_1 GGUF), single-stream decode.
    .venv/bin/python bench/compare_llamacpp.py [--dtypes float32 bfloat16]
"""
import sys

import side_by_side

sys.argv[1:1] = ["--engines", "pagedcore", "llamacpp", "--mode", "decode"]
side_by_side.main()
