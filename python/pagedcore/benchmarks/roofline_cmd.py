"""`pagedcore bench roofline`: this machine's ceilings and the model's floors, without running the engine.

Prints the CPU and ISA, torch's GEMM rate at the model's layer shapes per dtype and row count, memory
bandwidth, and the floors of a workload (FLOPs over the GEMM rate) and of batch-1 decode (weight
bytes over bandwidth). Pass measured figures with --measured NAME=SECONDS to see each gap.
"""

from __future__ import annotations

import json

from pagedcore.benchmarks import machine, roofline, workloads


def _model_config(model: str | None):
    """The model's config without building it (metadata only: fast)."""
    from pagedcore.loader.source import resolve_source

    source = resolve_source(model)
    if source.format == "gguf":
        from pagedcore.loader.gguf_file import GGUFFile
        from pagedcore.loader.gguf_loader import config_from_gguf
        return config_from_gguf(GGUFFile(source.path), "float32")
    from pagedcore.loader.hf_loader import config_from_hf, read_generation_config
    return config_from_hf(source.path, "float32", read_generation_config(source.path))



def cmd_roofline(args) -> int:
    from pagedcore.benchmarks.throughput import workload_lengths

    mc = _model_config(args.model)
    cost = roofline.ModelCost.of(mc)
    info = machine.cpu_info()
    print(f"machine: {machine.describe_cpu(info)}")
    from pagedcore.ops.linear_isa import dispatch_report
    print("kernel dispatch (what runs each family on this CPU; the engine logs the same at model load):")
    for family, what in dispatch_report():
        print(f"  {family:22s} {what}")
    ceilings = machine.measure_ceilings(mc, rows=tuple(args.rows), min_time=args.min_time,
                                        bandwidth_bytes=args.bandwidth_mib * 1024**2)
    print(machine.format_ceilings(ceilings))
    requests = workloads.make_workload(args.workload, mc.vocab_size, args.num_prompts, args.seed_workload,
                                       args.workload_file, **workload_lengths(args))
    flops = roofline.workload_flops(cost, requests)
    print(f"\nmodel: {cost.num_params() / 1e6:.1f} M parameters; linears {cost.linear_flops_per_token / 1e6:.1f} "
          f"MFLOP/token + lm_head {cost.lm_head_flops_per_row / 1e6:.1f} MFLOP/sampled row")
    print(f"workload ({args.workload}): {len(requests)} requests, {flops['tokens_through_layers']} tokens through "
          f"the layers, {flops['sampled_rows']} sampled rows: {flops['total'] / 1e12:.2f} TFLOP "
          f"(linears {flops['linear'] / 1e12:.2f}, lm_head {flops['lm_head'] / 1e12:.2f}, "
          f"attention {flops['attention'] / 1e12:.2f})")
    bw = ceilings["bandwidth"]
    floors = {}
    for dtype, rate in ceilings["gemm_gflops"].items():
        nbytes = 2 if dtype == "bfloat16" else 4
        floors[dtype] = {"gemm_gflops": rate, "workload_floor_seconds": flops["total"] / (rate * 1e9),
                         "decode_weight_bytes": cost.decode_weight_bytes(nbytes),
                         "decode_floor_tok_per_s_copy_bw": roofline.decode_floor_tok_s(cost, nbytes, bw["copy_gbps"]),
                         "decode_floor_tok_per_s_read_bw": roofline.decode_floor_tok_s(cost, nbytes, bw["read_gbps"])}
        f = floors[dtype]
        print(f"{dtype:>9}: workload floor {f['workload_floor_seconds']:.1f} s at {rate:.0f} GFLOP/s "
              f"({flops['sampled_rows'] / f['workload_floor_seconds']:.0f} output tok/s); batch-1 decode reads "
              f"{f['decode_weight_bytes'] / 1e6:.0f} MB a step: floor {f['decode_floor_tok_per_s_copy_bw']:.0f} tok/s "
              f"at the copy rate ({f['decode_floor_tok_per_s_read_bw']:.0f} at the read-only rate)")
    for item in args.measured:
        label, _, rest = item.partition("=")
        dtype, _, seconds = rest.partition(":")
        floor = floors[dtype]["workload_floor_seconds"]
        print(f"  {label}: {float(seconds):.1f} s = {roofline.gap(float(seconds), floor):.2f}x the {dtype} floor")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"machine": info, "ceilings": ceilings, "workload_flops": flops, "floors": floors}, f,
                      indent=1, default=str)
    return 0
