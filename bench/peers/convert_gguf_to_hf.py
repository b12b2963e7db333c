"""Converts the default GGUF once to an HF folder (fp32 safetensors + tokenizer), the form vLLM reads.

    .venv/bin/python bench/peers/convert_gguf_to_hf.py [--out /tmp/smollm2-135m-hf]

transformers dequantises the Q4_1 GGUF exactly as pagedcore's loader does, so every engine runs the
same weights. Runs in pagedcore's venv (transformers + gguf); skipped if the folder exists.
"""

import argparse
import os

from common import default_gguf

DEFAULT_OUT = "/tmp/smollm2-135m-hf"


def convert(out: str = DEFAULT_OUT, gguf_path: str | None = None) -> str:
    if os.path.exists(os.path.join(out, "config.json")):
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = gguf_path or default_gguf()
    folder, name = os.path.split(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # transformers tags a GGUF-loaded model as "quantized" and refuses to save it, although its
    # tensors are already plain fp32: drop the tag so save_pretrained writes them as they are.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=DEFAULT_OUT)
    print(convert(p.parse_args().out))
