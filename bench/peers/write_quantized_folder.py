"""An HF folder's decoder linears rounded to integers and saved as a pre-quantized checkpoint (the tensors
and quantization_config AutoGPTQ, AutoAWQ or llm-compressor's compressed-tensors write), for running those
loaders at full size without a hub download; with --dense, the same folder's weights dequantised back into
a plain fp32 folder by the loader's own formula (its perplexity against the quantized one isolates what
the kernels add).

    .venv/bin/python bench/peers/convert_gguf_to_hf.py                         # -> /tmp/smollm2-135m-hf
    .venv/bin/python bench/peers/write_quantized_folder.py gptq /tmp/smollm2-135m-gptq [--group-size 64] [--dense]
    .venv/bin/python bench/peers/write_quantized_folder.py awq|gptq8 OUT
    .venv/bin/python bench/peers/write_quantized_folder.py ct-w8a8|ct-w4a16|ct-w8a16|... OUT   # compressed-tensors
    .venv/bin/python bench/peers/write_quantized_folder.py ct-fp8-dynamic|fp8-dynamic|... OUT  # fp8 (e4m3)

Round-to-nearest (GPTQ sym; AWQ min..max with a zero point; compressed-tensors as its schemes define the
scales), with no GPTQ error feedback, AWQ scaling search or SmoothQuant: a stand-in for the formats, not
for their quality. The packing is the tests' (tests/quantization/gptq_awq_checkpoints.py,
compressed_tensors_checkpoints.py, fp8_checkpoints.py), written from the formats' definitions.
"""

import argparse
import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))  # the repository root, for tests.quantization


def write(method: str, src: str, dst: str, group_size: int, source_dtype: str | None = None) -> None:
    from safetensors.torch import load_file, save_file

    from tests.quantization import compressed_tensors_checkpoints as ct
    from tests.quantization import fp8_checkpoints as fp8
    from tests.quantization.gptq_awq_checkpoints import LINEARS, pack_awq, pack_gptq, quantize_groups

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "model.safetensors.index.json"))
    tensors = {}
    for name in sorted(os.listdir(src)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(src, name)))
    if source_dtype:  # e.g. a bf16 copy of an fp32 conversion: bf16 scales and token table, as hub models
        dtype = getattr(torch, source_dtype)
        tensors = {name: t.to(dtype) if t.is_floating_point() else t for name, t in tensors.items()}
    bits = 8 if method == "gptq8" else 4
    out = {}
    for name, tensor in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf != "weight" or prefix.rpartition(".")[2] not in LINEARS:
            out[name] = tensor.contiguous()
        elif method in fp8.SCHEMES:  # scales in the model's dtype (compressed-tensors) or fp32 (vLLM's fp8)
            scale_dtype = torch.float32 if fp8.SCHEMES[method][0] == "fp8" else tensor.dtype
            q, scales = fp8.quantize(tensor.float(), fp8.SCHEMES[method][1], scale_dtype,
                                     fp8.BLOCK_SIZES.get(method))  # (block-wise schemes: their blocks)
            out.update({f"{prefix}.{key}": value for key, value in fp8.layer_tensors(q, scales, method).items()})
        elif method.startswith("ct-"):
            fmt, ct_bits, strategy, size, symmetric, _, _ = ct.SCHEMES[method[3:]]
            q, scales, zp, g_idx = ct.quantize(tensor.float(), ct_bits, strategy, size, symmetric, tensor.dtype)
            stored = ct.layer_tensors(q, scales, zp, g_idx, fmt, ct_bits, symmetric, strategy)
            out.update({f"{prefix}.{key}": value for key, value in stored.items()})
        else:
            q, zeros, scales = quantize_groups(tensor.float(), group_size, method != "awq", bits)
            packed = (pack_awq(q, zeros, scales) if method == "awq"
                      else pack_gptq(q, zeros, scales, group_size, bits=bits))
            out.update({f"{prefix}.{key}": value for key, value in packed.items()})
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    if source_dtype:
        config["torch_dtype"] = source_dtype
    config["quantization_config"] = (
        fp8.quantization_config(method) if method in fp8.SCHEMES else
        ct.quantization_config(method[3:]) if method.startswith("ct-") else
        {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm"}
        if method == "awq" else
        {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": False, "sym": True})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)


def write_dense(src: str, dst: str) -> None:
    """The quantized folder src dequantised (the loader's integer weights' dequantized()) into a plain fp32
    folder dst."""
    from safetensors.torch import load_file, save_file

    from pagedcore.loader.quantization import prequantized_scheme

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    with open(os.path.join(dst, "config.json")) as f:
        config = json.load(f)
    scheme = prequantized_scheme(config.pop("quantization_config"), dst)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    weights = scheme.convert(iter(load_file(os.path.join(src, "model.safetensors")).items()), src)
    out = {name: (t.dequantized() if hasattr(t, "dequantized") else t).contiguous() for name, t in weights}
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from tests.quantization.compressed_tensors_checkpoints import SCHEMES
    from tests.quantization.fp8_checkpoints import SCHEMES as FP8_SCHEMES

    parser.add_argument("method", choices=["gptq", "gptq8", "awq", *(f"ct-{name}" for name in SCHEMES),
                                           *FP8_SCHEMES])
    parser.add_argument("out", help="the folder to write (replaced)")
    parser.add_argument("--src", default="/tmp/smollm2-135m-hf", help="a dense HF folder")
    parser.add_argument("--group-size", type=int, default=64, help="GPTQ / AWQ (compressed-tensors: the scheme's)")
    parser.add_argument("--dense", action="store_true", help="also write OUT-dense: the weights dequantised")
    parser.add_argument("--source-dtype", choices=["bfloat16", "float16"], default=None,
                        help="round the source's float tensors to this dtype first (scales and tables follow)")
    args = parser.parse_args()
    write(args.method, args.src, args.out, args.group_size, args.source_dtype)
    print("wrote", args.out)
    if args.dense:
        write_dense(args.out, args.out + "-dense")
        print("wrote", args.out + "-dense")


if __name__ == "__main__":
    main()
