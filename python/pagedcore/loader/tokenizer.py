"""Tokenizers: from an HF folder, or rebuilt from a GGUF file's metadata.

GGUF routes, fastest correct first (default model, measured on 2 cores):
  1. Byte-level BPE whose pre-tokenizer transformers leaves at the GPT-2 default (SmolLM2): built
     here with the tokenizers library, giving a backend whose JSON equals transformers' own (tested).
     ~0.3 s, and no import of transformers.models (itself ~1 s of a cold start).
  2. Any other vocabulary (sentencepiece, Llama 3 / Qwen2 split rules): our parsed metadata handed to
     transformers' GGUF converter, the code AutoTokenizer(gguf_file=) runs. ~0.3 s + that import.
  3. If transformers moves that converter: AutoTokenizer itself (~4 s: it re-reads the file twice).
One deliberate difference: transformers also adds GPT-2's "<|endoftext|>" to a byte-level vocabulary
that lacks it, with an id past the model's vocab (an embedding index error waiting to happen);
route 1 adds only the file's own tokens.
"""

from __future__ import annotations

import os
from typing import Any

from pagedcore.loader.errors import ModelLoadError

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# tokenizer.ggml.pre values transformers maps to the plain GPT-2 split (it overrides e.g. llama-bpe, qwen2).
_GPT2_SPLIT_PRE_TYPES = ("default", "gpt-2", "smollm")
# llama.cpp token types
_CONTROL, _USER_DEFINED = 3, 4
# GGUF `tokenizer.ggml.*` key -> the name transformers' converter expects in its tokenizer dict.
_GGUF_TOKENIZER_KEYS = {
    "model": "tokenizer_type", "pre": "pre_tokenizer_type", "tokens": "tokens", "scores": "scores",
    "token_type": "token_type", "merges": "merges", "precompiled_charsmap": "precompiled_charsmap",
    "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
    "unknown_token_id": "unk_token_id", "padding_token_id": "pad_token_id",
    "add_space_prefix": "add_prefix_space",
}
_SPECIAL_TOKEN_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                      "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}


def tokenizer_from_folder(folder: str):
    """AutoTokenizer over local files only: pagedcore never downloads."""
    from transformers import AutoTokenizer

    if not any(os.path.isfile(os.path.join(folder, name)) for name in _TOKENIZER_FILES):
        raise ModelLoadError(f"{folder} has no tokenizer files (any of {list(_TOKENIZER_FILES)}); save the "
                             "tokenizer into the folder, or load with load_tokenizer=False")
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(f"could not load a tokenizer from {folder} ({error}); the folder needs "
                             "tokenizer.json or tokenizer_config.json with its vocabulary files") from None


def tokenizer_from_gguf(path: str, metadata: dict[str, Any]):
    """A PreTrainedTokenizerFast that tokenizes as transformers' own GGUF tokenizer for this file."""
    from transformers import PreTrainedTokenizerFast

    if "tokenizer.ggml.tokens" not in metadata:
        raise ModelLoadError(f"{path} has no tokenizer (no tokenizer.ggml.tokens metadata); "
                             "pagedcore needs a GGUF with its vocabulary")
    if (metadata.get("tokenizer.ggml.model") == "gpt2"
            and metadata.get("tokenizer.ggml.pre", "default") in _GPT2_SPLIT_PRE_TYPES):
        backend = byte_level_backend(metadata)
    else:
        backend = converted_backend(path, metadata)
        if backend is None:  # another transformers layout: take the slow public route
            return tokenizer_via_auto(path)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **_tokenizer_config(metadata))


def byte_level_backend(metadata: dict[str, Any]):
    """A tokenizers.Tokenizer for a GPT-2-style byte-level BPE vocabulary (route 1 above)."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    tokens = metadata["tokenizer.ggml.tokens"]
    token_types = metadata.get("tokenizer.ggml.token_type") or [0] * len(tokens)
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    # Real BPE tokens are spelled in the byte alphabet; anything else (a raw-text special token) is
    # respelled byte by byte, as transformers does, so that every id keeps a distinct key.
    vocab = {token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8")): index
             for index, token in enumerate(tokens)}
    merges = [tuple(merge.split(" ")) for merge in metadata.get("tokenizer.ggml.merges", ())]
    backend = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                            end_of_word_suffix="", fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>) stay whole as special tokens, user-defined ones as plain added
    # tokens; a "control" token outside the byte alphabet is a llama.cpp mislabel and is skipped.
    backend.add_special_tokens([AddedToken(token, normalized=False, special=True)
                                for token, kind in zip(tokens, token_types)
                                if kind == _CONTROL and set(token) <= alphabet])
    backend.add_tokens([AddedToken(token, normalized=False, special=False)
                        for token, kind in zip(tokens, token_types) if kind == _USER_DEFINED])
    return backend


def converted_backend(path: str, metadata: dict[str, Any]):
    """transformers' GGUF converter on our parsed metadata (route 2); None if transformers lacks it."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except ImportError:
        return None
    tokenizer_dict = {name: metadata[f"tokenizer.ggml.{key}"] for key, name in _GGUF_TOKENIZER_KEYS.items()
                      if f"tokenizer.ggml.{key}" in metadata}
    try:
        backend, _ = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    except ValueError as error:
        raise ModelLoadError(f"cannot build the tokenizer of {path}: {error}") from None
    return backend


def tokenizer_via_auto(path: str):
    """Route 3: AutoTokenizer(gguf_file=)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                         gguf_file=os.path.basename(path), local_files_only=True)


def _tokenizer_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer_config.json a GGUF implies: chat template, BOS/EOS flags, special tokens."""
    config: dict[str, Any] = {}
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = metadata["tokenizer.chat_template"]
    for key in ("add_bos_token", "add_eos_token"):
        if f"tokenizer.ggml.{key}" in metadata:
            config[key] = bool(metadata[f"tokenizer.ggml.{key}"])
    if metadata.get("tokenizer.ggml.model") == "llama":
        # sentencepiece vocabularies: llama.cpp adds BOS unless the file says otherwise (as transformers)
        config.setdefault("add_bos_token", True)
    tokens = metadata["tokenizer.ggml.tokens"]
    for name, key in _SPECIAL_TOKEN_IDS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        config[name] = tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None
    return config


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table: printable Latin-1 bytes map to themselves, the
    other 68 bytes to code points from 256 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + extra)
            extra += 1
    return dict(sorted(table.items()))
