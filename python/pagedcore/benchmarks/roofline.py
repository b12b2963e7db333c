"""Floors from FLOPs and bytes: how fast this model could run a workload on this machine.

FLOPs (a multiply-add = 2 FLOPs), for a Llama-family decoder with hidden h, q size q = heads x head_dim,
kv size k = kv_heads x head_dim, MLP width I, L layers, vocab V:
    linears per token    L x 2h(q + 2k)  +  L x 2qh  +  L x 2h(2I)  +  L x 2Ih      (qkv, o, gate_up, down)
    lm_head per sampled row   2hV                  (logits only where a token is sampled)
    attention per token at context c  L x 4qc      (QK^T and PV over c cached positions)
A request with prompt p and output m runs p + m - 1 tokens through the layers (the last sampled
token is never fed back) and samples m rows. The floor divides FLOPs by the measured GEMM rate, an
optimistic bound since attention rarely runs at GEMM speed. A decode step at batch 1 must read every
weight once: its floor is weight bytes over the memory bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelCost:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = True

    @classmethod
    def of(cls, mc) -> ModelCost:
        return cls(mc.hidden_size, mc.intermediate_size, mc.num_layers, mc.num_heads, mc.num_kv_heads,
                   mc.head_dim, mc.vocab_size, mc.tie_word_embeddings)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_linear_params(self) -> int:
        h, q, k, i = self.hidden_size, self.q_size, self.kv_size, self.intermediate_size
        return h * (q + 2 * k) + q * h + h * 2 * i + i * h

    @property
    def linear_flops_per_token(self) -> int:
        """Every decoder layer's linears, without lm_head."""
        return 2 * self.num_layers * self.layer_linear_params

    @property
    def lm_head_flops_per_row(self) -> int:
        return 2 * self.hidden_size * self.vocab_size

    def attention_flops(self, context_len: int) -> int:
        """One token attending over context_len positions (itself included), all layers."""
        return 4 * self.num_layers * self.q_size * context_len

    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        norms = self.num_layers * 2 * self.hidden_size + self.hidden_size
        return self.num_layers * self.layer_linear_params + embed * (1 if self.tie_word_embeddings else 2) + norms

    def decode_weight_bytes(self, bytes_per_param: float) -> float:
        """Bytes a batch-1 decode step must read: all layer weights and the lm_head (the tied embedding;
        the embedding lookup itself reads one row)."""
        embed = self.vocab_size * self.hidden_size
        norms = self.num_layers * 2 * self.hidden_size + self.hidden_size
        return (self.num_layers * self.layer_linear_params + embed + norms) * bytes_per_param

    def kv_bytes_per_token(self, bytes_per_elem: int) -> int:
        return 2 * self.num_layers * self.kv_size * bytes_per_elem


def workload_flops(cost: ModelCost, requests) -> dict:
    """FLOPs of running each request from scratch (no prefix-cache hits): linear, lm_head, attention."""
    tokens = sampled = attn_positions = 0
    for r in requests:
        p, m = r.prompt_len, r.max_tokens
        n = p + m - 1                          # tokens through the layers
        tokens += n
        sampled += m
        attn_positions += n * (n + 1) // 2     # token at position i attends over i + 1 positions
    linear = tokens * cost.linear_flops_per_token
    lm_head = sampled * cost.lm_head_flops_per_row
    attention = cost.attention_flops(attn_positions)
    return {"tokens_through_layers": tokens, "sampled_rows": sampled, "linear": linear, "lm_head": lm_head,
            "attention": attention, "total": linear + lm_head + attention}


def throughput_floor(cost: ModelCost, requests, gemm_gflops: float) -> dict:
    f = workload_flops(cost, requests)
    return {"flops": f, "floor_seconds": f["total"] / (gemm_gflops * 1e9),
            "linear_floor_seconds": (f["linear"] + f["lm_head"]) / (gemm_gflops * 1e9)}


def decode_floor_tok_s(cost: ModelCost, bytes_per_param: int, bandwidth_gbps: float, batch: int = 1,
                       context_len: int = 0) -> float:
    """Tokens/s of a decode step bound by memory traffic: weights once per step, plus each sequence's KV."""
    step_bytes = cost.decode_weight_bytes(bytes_per_param) + batch * context_len * cost.kv_bytes_per_token(bytes_per_param)
    return batch * bandwidth_gbps * 1e9 / step_bytes


def decode_step_floor_seconds(cost: ModelCost, bytes_per_param: float, bandwidth_gbps: float, gemm_gflops: float,
                              batch: int = 1, context_len: int = 0, kv_bytes_per_elem: int | None = None) -> float:
    """A decode step's floor: the slower of reading the weights (and KV) and computing its FLOPs.
    bytes_per_param may be fractional (a quantized model: resident weight bytes / parameters);
    kv_bytes_per_elem defaults to it (a quantized model's KV cache is fp32: pass 4)."""
    kv_bytes = bytes_per_param if kv_bytes_per_elem is None else kv_bytes_per_elem
    step_bytes = (cost.decode_weight_bytes(bytes_per_param)
                  + batch * context_len * cost.kv_bytes_per_token(kv_bytes))
    flops = batch * (cost.linear_flops_per_token + cost.lm_head_flops_per_row + cost.attention_flops(context_len))
    return max(step_bytes / (bandwidth_gbps * 1e9), flops / (gemm_gflops * 1e9))


def gap(measured_seconds: float, floor_seconds: float) -> float:
    """How many times the floor a measurement is (1.0 = at the floor)."""
    return measured_seconds / floor_seconds if floor_seconds > 0 else float("inf")
