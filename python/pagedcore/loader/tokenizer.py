"""Tokenizers: from an HF folder, or rebuilt from a GGUF file's metadata.

GGUF route, fastest correct one measured: our header parser already holds the vocabulary and
merges, so we hand them to transformers' GGUF converter (the same code AutoTokenizer runs with
`gguf_file=`, so the result is the same tokenizer) and wrap the backend in PreTrainedTokenizerFast.
~0.3 s for the default model, against ~4 s for `AutoTokenizer.from_pretrained(dir, gguf_file=...)`,
which parses the file twice more with slower readers. If transformers moves that converter, we fall
back to AutoTokenizer: slower, same result.
"""

from __future__ import annotations

import os
from typing import Any

from pagedcore.loader.errors import ModelLoadError

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


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


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
    """A PreTrainedTokenizerFast equal to transformers' own GGUF tokenizer for this file."""
    from transformers import PreTrainedTokenizerFast

    if "tokenizer.ggml.tokens" not in metadata:
        raise ModelLoadError(f"{path} has no tokenizer (no tokenizer.ggml.tokens metadata); "
                             "pagedcore needs a GGUF with its vocabulary")
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except ImportError:  # another transformers layout: take the slow public route
        return _tokenizer_via_auto(path)
    tokenizer_dict = {name: metadata[f"tokenizer.ggml.{key}"] for key, name in _GGUF_TOKENIZER_KEYS.items()
                      if f"tokenizer.ggml.{key}" in metadata}
    try:
        backend, extra_kwargs = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    except ValueError as error:
        raise ModelLoadError(f"cannot build the tokenizer of {path}: {error}") from None
    return PreTrainedTokenizerFast(tokenizer_object=backend, **_tokenizer_config(metadata), **extra_kwargs)


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


def _tokenizer_via_auto(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                         gguf_file=os.path.basename(path), local_files_only=True)
