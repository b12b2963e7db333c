"""`pagedcore bench ...`: throughput, latency and serving benchmarks, workloads, roofline arithmetic."""
