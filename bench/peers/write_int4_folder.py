"""An HF folder's decoder linears rounded to 4 bits per group and saved as a GPTQ or AWQ checkpoint (the
tensors and quantization_config AutoGPTQ / AutoAWQ write), for running the GPTQ / AWQ loader at full size
without a hub download; with --dense, the same folder's weights dequantised back into a plain fp32 folder
by the loader's own formula (its perplexity against the 4-bit one isolates what the kernels add).

    .venv/bin/python bench/peers/convert_gguf_to_hf.py                        # -> /tmp/smollm2-135m-hf
    .venv/bin/python bench/peers/write_int4_folder.py gptq /tmp/smollm2-135m-gptq [--group-size 64] [--dense]
    .venv/bin/python bench/peers/write_int4_folder.py awq /tmp/smollm2-135m-awq

Round-to-nearest (GPTQ sym: zero 8; AWQ: min..max with a zero point), with no GPTQ error feedback and no
AWQ scaling search: a stand-in for the formats, not for their quality. The packing is the tests'
(tests/quantization/int4_checkpoints.py), written from the formats' definitions.
"""

import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))  # the repository root, for tests.quantization


def write(method: str, src: str, dst: str, group_size: int) -> None:
    from safetensors.torch import load_file, save_file

    from tests.quantization.int4_checkpoints import LINEARS, pack_awq, pack_gptq, quantize_groups

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "model.safetensors.index.json"))
    tensors = {}
    for name in sorted(os.listdir(src)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(src, name)))
    out = {}
    for name, tensor in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf == "weight" and prefix.rpartition(".")[2] in LINEARS:
            q, zeros, scales = quantize_groups(tensor.float(), group_size, sym=method == "gptq")
            packed = pack_gptq(q, zeros, scales, group_size) if method == "gptq" else pack_awq(q, zeros, scales)
            out.update({f"{prefix}.{key}": value for key, value in packed.items()})
        else:
            out[name] = tensor.contiguous()
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = (
        {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": False, "sym": True}
        if method == "gptq" else
        {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm"})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)


def write_dense(src: str, dst: str) -> None:
    """The 4-bit folder src dequantised (Int4Weight.dequantized) into a plain fp32 folder dst."""
    from safetensors.torch import load_file, save_file

    from pagedcore.loader.int4_checkpoint import Int4Weight, int4_scheme, int4_weights

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    scheme = int4_scheme(config.pop("quantization_config"), dst)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    weights = int4_weights(iter(load_file(os.path.join(src, "model.safetensors")).items()), scheme, src)
    out = {name: (t.dequantized() if isinstance(t, Int4Weight) else t).contiguous() for name, t in weights}
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("method", choices=["gptq", "awq"])
    parser.add_argument("out", help="the folder to write (replaced)")
    parser.add_argument("--src", default="/tmp/smollm2-135m-hf", help="a dense HF folder")
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--dense", action="store_true", help="also write OUT-dense: the weights dequantised")
    args = parser.parse_args()
    write(args.method, args.src, args.out, args.group_size)
    print("wrote", args.out)
    if args.dense:
        write_dense(args.out, args.out + "-dense")
        print("wrote", args.out + "-dense")


if __name__ == "__main__":
    main()
