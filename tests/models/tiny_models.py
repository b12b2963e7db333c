"""Tiny random-weight HF models (Llama, Mistral, Qwen2, Qwen3), saved as HF folders, for parity tests.

Weights are drawn large (initializer_range 0.15) and norms and biases randomised too, so logits are
far from ties and every parameter kind is exercised by the comparison. Test-only."""

from __future__ import annotations

import torch

VOCAB_SIZE = 512

_COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
               num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
               rms_norm_eps=1e-5, initializer_range=0.15, bos_token_id=1, eos_token_id=2)

# kind -> (config class name, overrides)
TINY_KINDS = {
    # GQA 8:2 and Llama 3.1 RoPE scaling (original context 64 < 256 so all three bands occur)
    "llama": ("LlamaConfig", dict(rope_theta=10000.0, rope_scaling={
        "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})),
    "llama_tied": ("LlamaConfig", dict(tie_word_embeddings=True, num_key_value_heads=4, rope_theta=100000.0)),
    "mistral": ("MistralConfig", dict(sliding_window=None, rope_theta=1e6)),
    "qwen2": ("Qwen2Config", dict(rope_theta=1e6, use_sliding_window=False)),
    # head_dim 32 != hidden / heads (16), as in real Qwen3 models
    "qwen3": ("Qwen3Config", dict(head_dim=32, rope_theta=1e6, use_sliding_window=False)),
}

# Shapes that split awkwardly over TP=2 / PP=2 (tests/distributed), built by build_hf_model too.
SHARD_KINDS = {
    # 6 query / 3 KV heads: TP=2 gives KV heads {0, 1} with 4 query heads and {2} with 2 (uneven, as the
    # default model's 9 / 3); q/k/v bias; odd intermediate (101 + 100 columns) and vocabulary (255 + 254
    # rows), untied head; 3 layers (PP=2: 2 + 1)
    "qwen2_uneven": ("Qwen2Config", dict(num_attention_heads=6, num_key_value_heads=3, hidden_size=96,
                                         intermediate_size=201, vocab_size=509, rope_theta=1e6,
                                         use_sliding_window=False)),
    # 4 query / 1 KV head: TP=2 replicates the KV head on both ranks; qk-norm; tied embeddings (the
    # vocab-parallel head is the embedding shard)
    "qwen3_replicated": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                             tie_word_embeddings=True, rope_theta=1e6, use_sliding_window=False)),
}


def make_tokenizer():
    """A byte-level BPE of ~300 tokens trained on a sentence: enough for load_model's tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(["The quick brown fox jumps over the lazy dog. " * 4], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>")
    tokenizer.chat_template = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
    return tokenizer


def build_hf_model(kind: str, seed: int = 0):
    """(HF model in fp32, eval mode) of the given kind, with every weight random."""
    import transformers

    config_class, overrides = {**TINY_KINDS, **SHARD_KINDS}[kind]
    config = getattr(transformers, config_class)(**{**_COMMON, **overrides})
    # HF initialises from the global generator: seed it for this build only, so building a model
    # (often lazily, inside a session fixture) does not reseed the tests that happen to run after it.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):  # ones by default: make the norms do something
                    param.copy_(1.0 + 0.2 * torch.randn_like(param))
                elif name.endswith(".bias"):  # zeros by default (Qwen2 q/k/v)
                    param.normal_(0.0, 0.2)
    return model


def save_hf_folder(model, folder, max_shard_size: str | None = None) -> str:
    kwargs = {"safe_serialization": True}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(folder, **kwargs)
    make_tokenizer().save_pretrained(folder)
    return str(folder)


def hf_logits(model, token_ids: list[int]) -> torch.Tensor:
    """fp32 logits of every position of one sequence, no cache: [len(token_ids), vocab]."""
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float()
