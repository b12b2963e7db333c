"""Single-stream decode through LLMEngine for bench/bench_decode.py: one request's time per output token,
and the same against the machine's bandwidth floor (a copy probe before each request, or a read of the
token's weight bytes after every step). Split out of bench_decode.py (its sections: the floor, the
model-level step, the per-op breakdown)."""

from __future__ import annotations

import statistics
import time

import torch


def _engine(loaded, num_scheduler_steps: int = 1):
    from pagedcore.config import EngineConfig
    from pagedcore.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(dtype=loaded.config.dtype, max_model_len=2048, kv_cache_memory="512MiB",
                                  num_scheduler_steps=num_scheduler_steps, kv_cache_commit="startup"), loaded=loaded)


def _one_request(engine, loaded, g, request_id: str, prompt_len: int, output_len: int):
    """One greedy request of a random prompt run to output_len tokens -> (seconds of each decode step
    after the prefill step, each step's engine.last_step_timing)."""
    from pagedcore.sampling_params import SamplingParams

    prompt = torch.randint(100, loaded.config.vocab_size, (prompt_len,), generator=g).tolist()
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    engine.add_request(request_id, prompt_token_ids=prompt, params=params, output_kind="delta")
    times, phases = [], []
    while engine.has_unfinished_requests():
        engine.step()
        times.append(time.perf_counter())
        phases.append(dict(engine.last_step_timing))
    return [b - a for a, b in zip(times, times[1:])], phases


def engine_single_stream(loaded, prompt_len: int, output_len: int, repeats: int) -> dict:
    engine = _engine(loaded)
    g = torch.Generator().manual_seed(1)
    best = None
    for r in range(repeats + 1):  # the first run warms up
        decode, phases = _one_request(engine, loaded, g, f"r{r}", prompt_len, output_len)
        if r == 0:
            continue
        tpot = statistics.median(decode)
        split = {k: statistics.median(p[k] for p in phases[1:]) for k in phases[1] if isinstance(phases[1][k], float)}
        if best is None or tpot < best["tpot"]:
            best = {"tpot": tpot, "tok_per_s": 1 / tpot, "mean_tok_per_s": len(decode) / sum(decode), "split": split}
    return best

def engine_against_floor(loaded, weight_bytes: int, rounds: int, prompt_len: int, output_len: int) -> dict:
    """Rounds of (the copy-bandwidth probe of `pagedcore bench roofline`, then one request of
    output_len greedy tokens through LLMEngine): each round's tok/s over the floor measured seconds
    before it. On a VM whose bandwidth drifts with its neighbours (the Zen 4 machine, 2026-12-03: copy
    probes of 27-49 GB/s seconds apart) a floor probed minutes apart from the run it divides misstates
    the ratio."""
    from pagedcore.benchmarks.machine import measure_bandwidth

    engine = _engine(loaded)
    g = torch.Generator().manual_seed(1)
    out = []
    for r in range(rounds + 1):  # the first run warms up
        copy_gbps = measure_bandwidth(min_time=0.3)["copy_gbps"]
        decode, _ = _one_request(engine, loaded, g, f"f{r}", prompt_len, output_len)
        if r == 0:
            continue
        tok_per_s = 1 / statistics.median(decode)
        floor = copy_gbps * 1e9 / weight_bytes
        out.append({"copy_gbps": copy_gbps, "floor_tok_per_s": floor, "tok_per_s": tok_per_s,
                    "of_floor": tok_per_s / floor})
    return {"rounds": out, "median_of_floor": statistics.median(x["of_floor"] for x in out)}


def engine_against_same_bytes(loaded, weight_bytes: int, rounds: int, prompt_len: int, output_len: int,
                              num_scheduler_steps: int = 1, reads_after: str = "step") -> dict:
    """Each decode step of `rounds` requests, followed at once by one read of as many bytes as the
    token's weights (a buffer of that size, streamed by _core.linear_read_probe on the kernels'
    threads): the floor measured within milliseconds of the token it divides, step by step. The copy
    probe of engine_against_floor is a 512 MB torch copy seconds apart from the run; on the Zen 4 VM
    (2026-12-03) the machine's bandwidth moved by tens of percent between such probes, so only a ratio
    taken step by step means anything there. Also splits each token into the C++ call (the one-call
    step's own timer) and the rest (Python: scheduling, inputs, outputs). With num_scheduler_steps > 1 a
    step yields several tokens: the read is repeated once per token (the bytes exceed the caches) and
    the step's times are divided by its tokens.

    reads_after="request" reads the same bytes once per token right after each request instead (each
    step's token against the reads of its own round, a quarter of a second later): the read between
    steps evicts everything the next step would find in cache (K/V, activations, the small weights),
    which costs that step ~5% on the Zen 5 VM (the same requests alternated with and without it: 1.863
    vs 1.776 ms a Q4_0 token), so "step" understates the engine by as much."""
    from pagedcore import _core

    engine = _engine(loaded, num_scheduler_steps)
    probe = torch.ones(weight_bytes // 4)  # fp32 ones: no denormals in the read loop's sums
    model = loaded.model
    offer = getattr(model, "greedy_decoder", None)
    g = torch.Generator().manual_seed(1)
    steps = []
    for r in range(rounds + 1):  # the first request warms up
        prompt = torch.randint(100, loaded.config.vocab_size, (prompt_len,), generator=g).tolist()
        params = _greedy_params(output_len)
        engine.add_request(f"s{r}", prompt_token_ids=prompt, params=params, output_kind="delta")
        engine.step()  # the prefill
        decoder = offer() if offer is not None else None
        if decoder is not None:
            decoder.set_timing(True)
            decoder.take_seconds()
        this_request = []   # (seconds a token, read seconds a token, in-call seconds a token) per step
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            outs = engine.step()
            step = time.perf_counter() - t0
            in_call = sum(decoder.take_seconds()) if decoder is not None else float("nan")
            n = sum(len(o.outputs[0].token_ids) for o in outs)  # tokens this step (delta outputs)
            read = 0.0
            if reads_after == "step":
                t1 = time.perf_counter()
                for _ in range(n):
                    _core.linear_read_probe(probe.data_ptr(), probe.nbytes, 0)
                read = time.perf_counter() - t1
            if n:
                this_request.append([step / n, read / n, in_call / n])
        if reads_after == "request":   # as many reads as the request's tokens, each timed
            reads = []
            for _ in range(output_len):
                t1 = time.perf_counter()
                _core.linear_read_probe(probe.data_ptr(), probe.nbytes, 0)
                reads.append(time.perf_counter() - t1)
            for s in this_request:
                s[1] = statistics.median(reads)
        if r > 0:
            steps.extend(tuple(s) for s in this_request)
        if decoder is not None:
            decoder.set_timing(False)
    med = statistics.median
    return {"steps": len(steps), "token_ms": med(s[0] for s in steps) * 1e3,
            "read_ms": med(s[1] for s in steps) * 1e3, "read_gbps": weight_bytes / med(s[1] for s in steps) / 1e9,
            "of_floor": med(s[1] / s[0] for s in steps), "call_of_floor": med(s[1] / s[2] for s in steps),
            "outside_call_ms": med(s[0] - s[2] for s in steps) * 1e3}


def _greedy_params(output_len: int):
    from pagedcore.sampling_params import SamplingParams

    return SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)


def load_format(name: str):
    """The default model in one format: a dtype (auto, float32, bfloat16), the GGUF re-quantized to a
    block format at load (q8_0, q4_0, q4_1, q5_0, q5_1), int8_per_channel (W8A8) or fp8 (e4m3 per row, weight-only; the
    dequantised weights quantized at load, --quantization fp8; fp8_bfloat16 the same under bf16 activations).
    The kernels' threading is set for it as an engine would (ops/kernel_threading.py), so the model-level
    sections run as the engine does."""
    from pagedcore.loader import load_model
    from pagedcore.loader.requantize import load_requantized
    from pagedcore.ops import kernel_threading

    if name in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"):
        loaded = load_requantized(None, name)
    elif name in ("int8_per_channel", "fp8"):
        loaded = load_model(dtype="auto", load_tokenizer=False, quantization=name)
    elif name == "fp8_bfloat16":  # --quantization fp8 --dtype bfloat16: bf16 activations (the bf16 pair dot)
        loaded = load_model(dtype="bfloat16", load_tokenizer=False, quantization="fp8")
    else:
        loaded = load_model(dtype=name, load_tokenizer=False)
    kernel_threading.apply_for_models(loaded.model)
    return loaded
