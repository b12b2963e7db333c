"""The page's comparison request: a JSON body in, every policy's metrics and chart series out."""

from __future__ import annotations

import dataclasses
import time

from pagedcore.simulator.cost_model import DEFAULT_COST_MODEL, CostModel
from pagedcore.simulator.simulation import DEFAULT_POLICIES, SimConfig, policy_config, simulate
from pagedcore.simulator.workload import WorkloadSpec, make_workload

MAX_REQUESTS = 20_000
MAX_TRACE_STEPS = 3000


def _fields(cls, values: dict, what: str) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"unknown {what} field(s) {unknown}; known: {sorted(names)}")
    return values


def run_comparison(body: dict) -> dict:
    """body: {"workload": WorkloadSpec fields, "config": SimConfig fields, "policies": [names],
    "cost_model": CostModel fields (optional), "trace_policy": a name to replay (optional)}."""
    spec = WorkloadSpec(**_fields(WorkloadSpec, body.get("workload", {}), "workload"))
    if spec.num_requests > MAX_REQUESTS:
        raise ValueError(f"num_requests {spec.num_requests} is more than this endpoint runs ({MAX_REQUESTS}); "
                         "use `pagedcore simulate` for larger workloads")
    config = dict(body.get("config", {}))
    config.setdefault("max_model_len", spec.max_request_len)
    base = SimConfig(**_fields(SimConfig, config, "config"))
    cost = CostModel(**body["cost_model"]) if body.get("cost_model") else DEFAULT_COST_MODEL
    policies = list(body.get("policies") or DEFAULT_POLICIES)
    trace_policy = body.get("trace_policy")
    requests = make_workload(spec)
    t0 = time.perf_counter()
    results, trace = [], None
    for name in policies:
        steps = MAX_TRACE_STEPS if name == trace_policy else 0
        r = simulate(requests, policy_config(base, name), cost, policy=name, trace_steps=steps)
        results.append({"policy": r.policy, "config": r.config, "metrics": r.metrics, "series": r.series})
        if r.records is not None:
            trace = r.records
    return {"workload": spec.to_dict(), "cost_model": dataclasses.asdict(cost), "results": results,
            "trace": trace, "wall_seconds": round(time.perf_counter() - t0, 3)}
