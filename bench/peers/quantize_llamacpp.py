"""A GGUF quantized by llama.cpp itself (llama-cpp-python's llama_model_quantize, the library behind
`llama-quantize`): e.g. the default model as a genuine Q4_K_M file, with llama.cpp's own type mix and fallbacks
(a small model's rows that are not whole 256-weight super-blocks become Q5_0 / Q5_1 / Q8_0). The input must be a
float GGUF: write one first with write_float_gguf.py.

    .venv/bin/python bench/peers/write_float_gguf.py /tmp/smollm2-135m-f16.gguf --type F16
    /tmp/llama-venv/bin/python bench/peers/quantize_llamacpp.py /tmp/smollm2-135m-f16.gguf \\
        /tmp/smollm2-135m-q4_k_m.gguf Q4_K_M
"""

import argparse
import ctypes


def main() -> None:
    import llama_cpp

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", help="a float (F32 / F16 / BF16) GGUF")
    parser.add_argument("dst")
    parser.add_argument("ftype", help="llama.cpp's file type name: Q4_K_M, Q5_K_M, Q4_K_S, Q6_K, Q8_0, ...")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.ftype}")
    params.nthread = args.threads
    rc = llama_cpp.llama_model_quantize(args.src.encode(), args.dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc})")
    print("wrote", args.dst)


if __name__ == "__main__":
    main()
