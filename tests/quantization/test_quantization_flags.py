"""--dtype / --quantization: what each combination loads, and the clear refusals (names that are
unknown, pre-quantized checkpoints other than 4-bit GPTQ / AWQ, combinations that cannot run).
GPTQ / AWQ / compressed-tensors checkpoints themselves: test_gptq_awq_checkpoint.py, test_compressed_tensors.py."""

from __future__ import annotations

import json

import pytest
from gguf import GGMLQuantizationType as T

from pagedcore.cli import main
from pagedcore.config import EngineConfig
from pagedcore.loader import load_model
from pagedcore.loader.errors import ModelLoadError

from ..models import tiny_models
from . import quant_models

SUPPORTED = r"gguf \(a \.gguf file.*int8_per_channel"


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    return quant_models.write_block_gguf(tmp_path_factory.mktemp("g") / "m.gguf", "llama_tied", T.Q4_1)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    return tiny_models.save_hf_folder(tiny_models.build_hf_model("llama_tied"), tmp_path_factory.mktemp("hf"))


def test_what_each_combination_loads(gguf_path, hf_folder):
    cases = [  # (model, dtype, quantization) -> (weight_format, activation dtype)
        ((gguf_path, "auto", None), ("gguf", "float32")),
        ((gguf_path, "auto", "gguf"), ("gguf", "float32")),
        ((gguf_path, "float32", "gguf"), ("gguf", "float32")),
        ((gguf_path, "float32", None), ("float32", "float32")),
        ((gguf_path, "bfloat16", None), ("bfloat16", "bfloat16")),
        ((gguf_path, "auto", "int8_per_channel"), ("int8_per_channel", "float32")),
        ((hf_folder, "auto", None), ("float32", "float32")),
        ((hf_folder, "bfloat16", None), ("bfloat16", "bfloat16")),
        ((hf_folder, "auto", "int8_per_channel"), ("int8_per_channel", "float32")),
    ]
    for (model, dtype, quantization), expected in cases:
        loaded = load_model(model, dtype=dtype, quantization=quantization, load_tokenizer=False)
        assert (loaded.weight_format, loaded.config.dtype) == expected, (model, dtype, quantization)


@pytest.mark.parametrize("name, message", [
    ("gptq_marlin", r"quantization 'gptq_marlin' is not supported by pagedcore; use " + SUPPORTED),
    ("bitsandbytes", r"quantization 'bitsandbytes' is not supported by pagedcore; use " + SUPPORTED),
    ("int4", r"unknown quantization 'int4'; pagedcore supports " + SUPPORTED),
])
def test_unsupported_names_are_refused_with_the_list(gguf_path, name, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(quantization=name)
    with pytest.raises(ModelLoadError, match=message):
        load_model(gguf_path, quantization=name, load_tokenizer=False)


def test_refused_combinations(gguf_path, hf_folder):
    with pytest.raises(ModelLoadError, match="'gguf' serves a .gguf file's blocks; this is an HF folder"):
        load_model(hf_folder, quantization="gguf")
    for model, quantization in ((gguf_path, "gguf"), (hf_folder, "int8_per_channel")):
        with pytest.raises(ModelLoadError, match="runs float32 activations; use --dtype auto"):
            load_model(model, dtype="bfloat16", quantization=quantization)


@pytest.mark.parametrize("method", ["bitsandbytes", "fbgemm_fp8", "modelopt"])
def test_prequantized_hf_checkpoints_are_refused_by_name(hf_folder, tmp_path, method):
    import shutil

    folder = shutil.copytree(hf_folder, tmp_path / method)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": method, "bits": 4, "group_size": 128}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=f"pre-quantized '{method}' checkpoint.*GPTQ.*AWQ.*compressed-tensors.*Q4_K.*int8_per_channel"):
        load_model(str(folder))


def test_cli_defaults_and_errors(capsys, gguf_path):
    import argparse

    from pagedcore.entrypoints.engine_args import add_engine_args, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args([]))
    assert (config.dtype, config.quantization) == ("auto", None)   # a GGUF as stored; an HF folder float32
    config = engine_config_from_args(parser.parse_args(["--device", "cuda"]))
    assert config.dtype == "float32"   # the quantized kernels are CPU-only: on a GPU auto dequantises
    config = engine_config_from_args(parser.parse_args(["-q", "int8_per_channel", "--dtype", "float32"]))
    assert (config.dtype, config.quantization) == ("float32", "int8_per_channel")
    assert main(["generate", "hi", "--model", gguf_path, "--quantization", "awq"]) == 2
    assert "--quantization awq loads an HF folder stored in that format" in capsys.readouterr().err
    assert main(["generate", "hi", "--model", gguf_path, "--dtype", "bfloat16", "--quantization", "gguf"]) == 2
    assert "runs float32 activations" in capsys.readouterr().err
