"""The Llama family in one implementation: Llama 2/3, SmolLM2, TinyLlama, Mistral, Qwen2, Qwen3.

What differs between them is config, not code: GQA (num_kv_heads), q/k/v bias (Qwen2), per-head
q/k RMSNorm before RoPE (Qwen3), RoPE scaling (Llama 3.1), tied embeddings (SmolLM2, small Qwens).
Parameter names follow HF (`model.layers.N.self_attn...`) so checkpoints map without a table,
except the fused projections: q/k/v -> qkv_proj, gate/up -> gate_up_proj. How linear weights are
stored (the weight format) is the LinearMethod the loader passes in; this code never asks which.

A shard (tensor / pipeline parallelism, distributed/sharding.py) is the same model built from the
rank's ModelConfig (its heads, KV heads, intermediate columns, layers) plus its ShardPlan and the
stage's Communicator: o_proj and down_proj become RowParallelLinear (partial sums, all-reduced), the
embedding a VocabParallelEmbedding, the LM head this rank's vocabulary rows; a pipeline stage holds
its layers only (local indices 0..n), the embedding on the first stage, norm and head on the last.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

from pagedcore.distributed.intermediate_tensors import IntermediateTensors
from pagedcore.layers import (Attention, AttentionMetadata, Linear, MergedLinear, RMSNorm,
                              RotaryEmbedding, VocabEmbedding, apply_rotary_emb)
from pagedcore.layers.decoder_stack import DecoderStack, layer_tensors, lora_batch_of, stack_weight
from pagedcore.layers.decoder_stack_support import StackSupport, decoder_stack_support
from pagedcore.layers.embedding import VocabParallelEmbedding
from pagedcore.layers.held_weights import hold_16bit_enabled
from pagedcore.layers.linear import LinearMethod, RowParallelLinear, linear_method
from pagedcore.layers.linear_quant import BLOCK_METHODS
from pagedcore.layers.weights import CheckpointTensor, copy_weight
from pagedcore.model_config import ModelConfig
from pagedcore.models.greedy_decode import GreedyDecode, binding_key

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
logger = logging.getLogger(__name__)


def _row_parallel(in_features: int, out_features: int, method: LinearMethod, tp_comm) -> Linear:
    """o_proj / down_proj: a plain Linear in one process, RowParallelLinear in a tensor-parallel shard."""
    if tp_comm is None:
        return Linear(in_features, out_features, bias=False, method=method)
    return RowParallelLinear(in_features, out_features, method, tp_comm)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, method: LinearMethod, tp_comm=None):
        super().__init__()
        dtype = config.torch_dtype
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.qkv_proj = MergedLinear(config.hidden_size, {"q": config.q_size, "k": config.kv_size,
                                                          "v": config.kv_size},
                                     bias=config.attention_bias, method=method)
        self.o_proj = _row_parallel(config.q_size, config.hidden_size, method, tp_comm)
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
    def __init__(self, config: ModelConfig, method: LinearMethod, tp_comm=None):
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, {"gate": size, "up": size}, bias=False, method=method)
        self.down_proj = _row_parallel(size, config.hidden_size, method, tp_comm)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[num_tokens, hidden_size] -> [num_tokens, hidden_size]."""
        return self.down_proj(self.gate_up_proj.forward_silu_mul(hidden))  # via [num_tokens, intermediate]


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, method: LinearMethod, tp_comm=None):
        """tp_comm: the stage's tensor-parallel Communicator in a TP shard (config: the rank's sizes)."""
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
        self.self_attn = LlamaAttention(config, method, tp_comm)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
        self.mlp = LlamaMLP(config, method, tp_comm)

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
    def __init__(self, config: ModelConfig, method: LinearMethod, shard=None, tp_comm=None):
        """shard: a distributed.sharding.ShardPlan (config is then the rank's shard_config), else None."""
        super().__init__()
        dtype = config.torch_dtype
        self.shard = shard
        # A quantized file (GGUF, GPTQ, AWQ, compressed-tensors), or an fp32 model of a 16-bit checkpoint (the
        # linears likewise: layers/held_weights.py hold_16bit_enabled), keeps a bf16 or fp16 table as stored
        keep_16bit = getattr(method, "format", None) in BLOCK_METHODS or (
            getattr(method, "format", None) == "float32" and hold_16bit_enabled())
        if shard is None:
            self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, dtype, keep_16bit)
        elif not shard.has_embedding:
            self.embed_tokens = None
        elif tp_comm is not None:
            self.embed_tokens = VocabParallelEmbedding(*shard.vocab, config.hidden_size, dtype, tp_comm)
        else:
            self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, dtype, keep_16bit)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, method, tp_comm) for _ in range(config.num_layers))
        last = shard is None or shard.is_last_stage
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype) if last else None
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                                          config.rope_theta, config.rope_scaling, dtype)
        self.config = config
        self._stack: DecoderStack | None = None  # built once the weights are loaded, where supported
        self._stack_status = StackSupport(False, "the weights are not loaded yet")
        self._stack_key: tuple | None = None  # where the weights were when _stack_status was decided
        self._logged_reason: str | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata, intermediate: IntermediateTensors | None = None):
        if self.shard is not None:
            return self.forward_stage(input_ids, positions, kv_cache, attn_metadata, intermediate)
        hidden = self.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        cos_sin = self.rotary_emb(positions)  # [num_tokens, head_dim]: the one lookup of the step
        stack = self._decoder_stack()
        if stack is not None and stack.takes(hidden, kv_cache):
            # Small steps: every layer in one C++ call (same ops, same rounding; no dispatch between ops).
            hidden, residual = stack(hidden, cos_sin, kv_cache, attn_metadata)
        else:
            hidden, residual = self.run_layers(hidden, cos_sin, kv_cache, attn_metadata)
        hidden, _ = self.norm.add_and_norm(hidden, residual)
        return hidden

    def forward_stage(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                      attn_metadata: AttentionMetadata, intermediate: IntermediateTensors | None
                      ) -> torch.Tensor | IntermediateTensors:
        """A shard's forward: the first stage starts from the embeddings, a later one from the previous
        stage's IntermediateTensors; the last stage returns the normed hidden [num_tokens, hidden_size],
        the others IntermediateTensors. kv_cache holds this stage's layers only."""
        cos_sin = self.rotary_emb(positions)  # [num_tokens, head_dim]
        if self.shard.is_first_stage:
            hidden, residual = self.embed_tokens(input_ids), None  # [num_tokens, hidden_size]
        elif intermediate is None:
            raise ValueError(f"pipeline stage {self.shard.pp_rank} needs the previous stage's IntermediateTensors")
        else:
            hidden, residual = intermediate.hidden, intermediate.residual
        stack = self._decoder_stack()
        if stack is not None and stack.takes(hidden, kv_cache):
            if residual is not None:
                # The stack starts from a residual stream of one tensor: the first layer's add-and-norm
                # of (hidden, residual) is norm(residual + hidden), the same sum rounded once.
                hidden = residual + hidden
            hidden, residual = stack(hidden, cos_sin, kv_cache, attn_metadata)
        else:
            hidden, residual = self.run_layers(hidden, cos_sin, kv_cache, attn_metadata, residual)
        if not self.shard.is_last_stage:
            return IntermediateTensors(hidden, residual)
        hidden, _ = self.norm.add_and_norm(hidden, residual)
        return hidden

    def run_layers(self, hidden: torch.Tensor, cos_sin: torch.Tensor, kv_cache: torch.Tensor,
                   attn_metadata: AttentionMetadata, residual: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """The Python layer loop: hidden [num_tokens, hidden_size] (the embeddings, or a previous
        stage's output with its residual) -> (the last layer's output, residual), writing this step's
        K/V into kv_cache."""
        for index, layer in enumerate(self.layers):
            layer_cache = kv_cache[index]  # [2, num_blocks, num_kv_heads, block_size, head_dim]
            hidden, residual = layer(hidden, residual, cos_sin, layer_cache[0], layer_cache[1], attn_metadata)
        return hidden, residual

    def forward_first_layers(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                             attn_metadata: AttentionMetadata, num_layers: int,
                             stack: DecoderStack | None = None) -> torch.Tensor:
        """Layer-skip drafts (spec_decode/layer_skip.py): the first num_layers layers, then the final
        norm -> [num_tokens, hidden_size]. kv_cache holds (at least) those layers; stack: a
        DecoderStack over exactly them, used where it takes the step."""
        hidden = self.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        cos_sin = self.rotary_emb(positions)  # [num_tokens, head_dim]
        if stack is not None and stack.takes(hidden, kv_cache):
            hidden, residual = stack(hidden, cos_sin, kv_cache[:num_layers], attn_metadata)
        else:
            residual = None
            for index, layer in enumerate(self.layers[:num_layers]):
                layer_cache = kv_cache[index]  # [2, num_blocks, num_kv_heads, block_size, head_dim]
                hidden, residual = layer(hidden, residual, cos_sin, layer_cache[0], layer_cache[1], attn_metadata)
        hidden, _ = self.norm.add_and_norm(hidden, residual)
        return hidden

    def _decoder_stack(self) -> DecoderStack | None:
        """The C++ stack over these layers' weights; None where it does not run them all
        (decoder_stack_status says why). Decided again when the weights move (model.to())."""
        stack = self._stack
        if stack is not None and stack.matches(stack_weight(self.layers[0].self_attn.qkv_proj)):
            return stack
        if self._stack_key != self._weights_key():
            self.refresh_decoder_stack()
        return self._stack

    def _weights_key(self) -> tuple:
        anchor = self.layers[0].input_layernorm.weight  # every format has it; it moves with the rest
        return anchor.data_ptr(), anchor.dtype, anchor.device

    @property
    def decoder_stack_status(self) -> StackSupport:
        """Whether small steps run the C++ decoder stack, and if not, why (for the weights as they are now)."""
        self._decoder_stack()
        return self._stack_status

    def refresh_decoder_stack(self) -> None:
        """Decides (again) whether the stack runs these layers and builds it if so. Called after
        loading and when the weights move; a feature that changes the layers in place calls it too.
        A reason to decline is logged once."""
        self._stack = None
        status = self._stack_status = decoder_stack_support(self.config, self.layers)
        self._stack_key = self._weights_key()
        if not status.supported:
            if status.reason != self._logged_reason:
                logger.info("small steps run the Python layer loop, not the C++ decoder stack: %s", status.reason)
                self._logged_reason = status.reason
            return
        cfg = self.config
        self._stack = DecoderStack([layer_tensors(layer) for layer in self.layers], hidden_size=cfg.hidden_size,
                                   num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                                   intermediate_size=cfg.intermediate_size, rms_norm_eps=cfg.rms_norm_eps,
                                   attn_scale=self.layers[0].self_attn.attn.scale,
                                   lora_batch=lora_batch_of(self.layers))


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, method: LinearMethod | None = None, shard=None, tp_comm=None):
        """method: the linear layers' weight format (the loader chooses it); None: dense in config.dtype.
        shard, tp_comm: one rank's part (distributed/model_shard.py builds it; config is then the
        rank's shard_config, tp_comm None unless tensor-parallel)."""
        super().__init__()
        self.config = config
        method = method if method is not None else linear_method(config.dtype)
        self.linear_method = method
        self.model = LlamaModel(config, method, shard, tp_comm)
        self.shard = shard
        # Tied: the LM head reads the embedding table; no second [vocab, hidden] copy. Logits go
        # straight to fp32 from the kernel (bf16 models skip a rounding and a cast). A shard's head
        # is its vocabulary rows (on the last stage only).
        vocab_rows = config.vocab_size if shard is None else shard.vocab[1] - shard.vocab[0]
        has_head = shard is None or shard.is_last_stage
        self.lm_head = (None if config.tie_word_embeddings or not has_head
                        else Linear(config.hidden_size, vocab_rows, bias=False, method=method.for_lm_head(),
                                    out_dtype=torch.float32))
        if config.tie_word_embeddings and has_head and self.model.embed_tokens is not None:
            self.model.embed_tokens.tied_head = True  # it may repack for the head (layers/embedding.py)
        self._greedy: GreedyDecode | None = None  # the one-call greedy step (models/greedy_decode.py)
        self._greedy_key: tuple | None = None     # what it was decided for (binding_key)
        self.greedy_decode_reason = "not decided yet"  # why there is none ("" when there is)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata, intermediate: IntermediateTensors | None = None):
        """input_ids, positions int64 [num_tokens]; kv_cache
        [num_layers, 2, num_blocks, num_kv_heads, block_size, head_dim].
        Returns hidden states after the final norm, [num_tokens, hidden_size]; a shard that is not
        the last pipeline stage returns IntermediateTensors (and a later stage takes them in)."""
        return self.model(input_ids, positions, kv_cache, attn_metadata, intermediate)

    @property
    def decoder_stack_status(self) -> StackSupport:
        return self.model.decoder_stack_status

    def greedy_decoder(self) -> GreedyDecode | None:
        """The one-call greedy step over the weights as they are now (decided again when they move),
        or None (greedy_decode_reason says why)."""
        key = binding_key(self)
        if key != self._greedy_key:
            self._greedy_key = key
            if key == (None,):
                self._greedy, self.greedy_decode_reason = None, "off (a shard, or PAGEDCORE_GREEDY_DECODE=0)"
            else:
                self._greedy, self.greedy_decode_reason = GreedyDecode.of(self)
        return self._greedy

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[num_rows, hidden_size] (only the rows being sampled) -> fp32 [num_rows, vocab_size]; a
        tensor-parallel shard gives its vocabulary columns (vocab_range) only."""
        if self.lm_head is not None:
            return self.lm_head(hidden_states)
        if self.model.norm is None:
            raise ValueError(f"pipeline stage {self.shard.pp_rank} has no LM head: logits come from the last stage")
        return self.model.embed_tokens.logits(hidden_states)  # tied: the table's own format and bytes

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
            module = self.get_submodule(module_name)
            if isinstance(module, (Linear, VocabEmbedding)):
                module.load_weight(param_name, tensor, name)  # its weight format fills it
            else:
                copy_weight(params[name].data, tensor, name)
            unfilled[name].discard(None)
        missing = sorted(f"{name}[{shard}]" if shard else name
                         for name, shards in unfilled.items() for shard in shards)
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise ValueError(f"the checkpoint does not fill {len(missing)} parameter(s): {shown}")
        for module in self.modules():
            if isinstance(module, Linear):
                module.method.process_weights_after_loading(module)  # e.g. quantized rows repacked
            elif isinstance(module, VocabEmbedding):
                module.process_weights_after_loading()  # a blocked table (and tied head) likewise
        self.model.refresh_decoder_stack()
