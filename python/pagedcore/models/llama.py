"""The Llama family in one implementation: Llama 2/3, SmolLM2, TinyLlama, Mistral, Qwen2, Qwen3.

What differs between them is config, not code: GQA (num_kv_heads), q/k/v bias (Qwen2), per-head
q/k RMSNorm before RoPE (Qwen3), RoPE scaling (Llama 3.1), tied embeddings (SmolLM2, small Qwens).
Parameter names follow HF (`model.layers.N.self_attn...`) so checkpoints map without a table,
except the fused projections: q/k/v -> qkv_proj, gate/up -> gate_up_proj.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
from torch import nn

from pagedcore.layers import (Attention, AttentionMetadata, Linear, MergedLinear, RMSNorm,
                              RotaryEmbedding, VocabEmbedding, apply_rotary_emb)
from pagedcore import kernels_linear
from pagedcore.layers.decoder_stack import DecoderStack, LayerTensors
from pagedcore.layers.linear import KernelBinding
from pagedcore.layers.weights import CheckpointTensor, copy_weight
from pagedcore.model_config import ModelConfig

# Checkpoint projection -> (fused parameter it lands in, shard id inside it).
_FUSED_SHARDS = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
# Non-weight entries some checkpoints carry; the rotary cache is computed from the config instead.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# A GGUF Llama 3 stores its RoPE rescaling as per-frequency divisors; the GGUF loader names it so.
ROPE_FREQ_FACTORS = "model.rotary_emb.freq_factors"
# PAGEDCORE_DECODER_STACK=0 keeps small steps on the Python layer loop (benchmarks compare the two).
_STACK_ENABLED = os.environ.get("PAGEDCORE_DECODER_STACK", "1") != "0"


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        dtype = config.torch_dtype
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.qkv_proj = MergedLinear(config.hidden_size, {"q": config.q_size, "k": config.kv_size,
                                                          "v": config.kv_size},
                                     bias=config.attention_bias, dtype=dtype)
        self.o_proj = Linear(config.q_size, config.hidden_size, bias=False, dtype=dtype)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if config.qk_norm else None
        self.attn = Attention(config.num_heads, config.num_kv_heads, config.head_dim,
                              scale=config.head_dim ** -0.5)

    def forward(self, hidden: torch.Tensor, cos_sin: torch.Tensor,
                key_cache: torch.Tensor, value_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        """hidden [num_tokens, hidden_size] -> [num_tokens, hidden_size]."""
        num_tokens = hidden.shape[0]
        num_qk_heads = self.num_heads + self.num_kv_heads
        qkv = self.qkv_proj(hidden)  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]
        qk = qkv[:, :num_qk_heads * self.head_dim].view(num_tokens, num_qk_heads, self.head_dim)
        v = qkv[:, num_qk_heads * self.head_dim:].view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # Qwen3: normalise each head before RoPE, back into the same buffer
            qk[:, :self.num_heads] = self.q_norm(qk[:, :self.num_heads])
            qk[:, self.num_heads:] = self.k_norm(qk[:, self.num_heads:])
        apply_rotary_emb(qk, cos_sin)  # q and k rotate together: [num_tokens, num_qk_heads, head_dim]
        out = self.attn(qk[:, :self.num_heads], qk[:, self.num_heads:], v,
                        key_cache, value_cache, attn_metadata)  # [num_tokens, num_heads * head_dim]
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, {"gate": size, "up": size}, bias=False,
                                         dtype=config.torch_dtype)
        self.down_proj = Linear(size, config.hidden_size, bias=False, dtype=config.torch_dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[num_tokens, hidden_size] -> [num_tokens, hidden_size]."""
        return self.down_proj(self.gate_up_proj.forward_silu_mul(hidden))  # via [num_tokens, intermediate]


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
        self.mlp = LlamaMLP(config)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, cos_sin: torch.Tensor,
                key_cache: torch.Tensor, value_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous layer's output, not yet added into residual (both [num_tokens, hidden_size]);
        the first layer gets the embeddings and residual None. Returns (output, residual)."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        hidden = self.self_attn(hidden, cos_sin, key_cache, value_cache, attn_metadata)
        hidden, residual = self.post_attention_layernorm.add_and_norm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        dtype = config.torch_dtype
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                                          config.rope_theta, config.rope_scaling, dtype)
        self.config = config
        self._stack: DecoderStack | None = None  # built at the first small step (weights loaded by then)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        cos_sin = self.rotary_emb(positions)  # [num_tokens, head_dim]: the one lookup of the step
        stack = self._decoder_stack()
        if stack is not None and stack.takes(hidden, kv_cache):
            # Small steps: every layer in one C++ call (same ops, same rounding; no dispatch between ops).
            hidden, residual = stack(hidden, cos_sin, kv_cache, attn_metadata)
        else:
            residual = None
            for index, layer in enumerate(self.layers):
                layer_cache = kv_cache[index]  # [2, num_blocks, num_kv_heads, block_size, head_dim]
                hidden, residual = layer(hidden, residual, cos_sin, layer_cache[0], layer_cache[1],
                                         attn_metadata)
        hidden, _ = self.norm.add_and_norm(hidden, residual)
        return hidden

    def _decoder_stack(self) -> DecoderStack | None:
        """The C++ stack over these layers' weights, built at first use and again if they moved;
        None where it cannot run them (no kernel, not fp32/bf16, weights off the CPU)."""
        qkv = self.layers[0].self_attn.qkv_proj.weight
        stack = self._stack
        if stack is not None and stack.matches(qkv):
            return stack
        self._stack = None
        if not (_STACK_ENABLED and kernels_linear.available() and qkv.is_cpu
                and qkv.dtype in (torch.float32, torch.bfloat16)):
            return None
        cfg = self.config
        layers = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            layers.append(LayerTensors(
                input_norm=layer.input_layernorm.weight, post_norm=layer.post_attention_layernorm.weight,
                q_norm=attn.q_norm.weight if attn.q_norm is not None else None,
                k_norm=attn.k_norm.weight if attn.k_norm is not None else None,
                qkv=attn.qkv_proj.weight, qkv_bias=attn.qkv_proj.bias, o_proj=attn.o_proj.weight,
                gate_up=mlp.gate_up_proj.weight, down=mlp.down_proj.weight))
        self._stack = DecoderStack(layers, hidden_size=cfg.hidden_size, num_heads=cfg.num_heads,
                                   num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                                   intermediate_size=cfg.intermediate_size, rms_norm_eps=cfg.rms_norm_eps,
                                   attn_scale=self.layers[0].self_attn.attn.scale)
        return self._stack


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        # Tied: the LM head reads the embedding table; no second [vocab, hidden] copy.
        self.lm_head = (None if config.tie_word_embeddings
                        else Linear(config.hidden_size, config.vocab_size, bias=False, dtype=config.torch_dtype))
        # Logits straight to fp32 from the kernel (bf16 models skip a rounding and a cast).
        self._logits_kernel = KernelBinding(self.model.embed_tokens.weight, out_dtype=torch.float32)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions int64 [num_tokens]; kv_cache
        [num_layers, 2, num_blocks, num_kv_heads, block_size, head_dim].
        Returns hidden states after the final norm, [num_tokens, hidden_size]."""
        return self.model(input_ids, positions, kv_cache, attn_metadata)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[num_rows, hidden_size] (only the rows being sampled) -> fp32 [num_rows, vocab_size]."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if self._logits_kernel.takes(hidden_states):
            return self._logits_kernel(hidden_states, weight, None)
        return kernels_linear.torch_linear(hidden_states, weight, None).float()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, CheckpointTensor]]) -> None:
        """Copies checkpoint tensors, named as in HF checkpoints, into the parameters (converting
        dtype once); q/k/v and gate/up land in their fused parameter's rows. Raises if a tensor has
        no parameter, a shape differs, or a parameter is left unfilled."""
        params = dict(self.named_parameters())
        unfilled = {name: set(getattr(self.get_submodule(name.rsplit(".", 1)[0]), "shard_rows", {None}))
                    for name in params}  # parameter -> shard ids still to load (None: the whole tensor)
        for name, tensor in weights:
            if name.endswith(_IGNORED_SUFFIXES) or (name == "lm_head.weight" and self.lm_head is None):
                continue
            if name == ROPE_FREQ_FACTORS:
                factors = torch.empty(tuple(tensor.shape), dtype=torch.float32)
                copy_weight(factors, tensor, name)
                self.model.rotary_emb.apply_freq_factors(factors)
                continue
            module_name, _, param_name = name.rpartition(".")
            parent, _, projection = module_name.rpartition(".")
            if projection in _FUSED_SHARDS:
                fused, shard_id = _FUSED_SHARDS[projection]
                target = f"{parent}.{fused}.{param_name}"
                if target not in params:
                    raise ValueError(f"checkpoint tensor {name!r} has no parameter {target!r} in this model")
                self.get_submodule(f"{parent}.{fused}").load_shard(shard_id, param_name, tensor, name)
                unfilled[target].discard(shard_id)
                continue
            if name not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no parameter in {type(self).__name__}; "
                                 "is the architecture in config.json right?")
            copy_weight(params[name].data, tensor, name)
            unfilled[name].discard(None)
        missing = sorted(f"{name}[{shard}]" if shard else name
                         for name, shards in unfilled.items() for shard in shards)
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise ValueError(f"the checkpoint does not fill {len(missing)} parameter(s): {shown}")
