"""The `pagedcore serve` flags users copy from vLLM: each one works or is refused with a message that
names it; none is silently ignored. Parser-level (no server), plus one engine for the block override."""

from __future__ import annotations

import argparse

import pytest

from pagedcore.entrypoints.engine_args import engine_config_from_args
from pagedcore.serving.auth import parse_api_keys
from pagedcore.serving.cli import add_serve_parser


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_api_key_in_every_form_vllm_users_write():
    args = parse("model.gguf", "--api-key", "k1", "k2,k3", "--api-key", "k4")
    assert args.model == "model.gguf"
    assert parse_api_keys(args.api_key, environ={"PAGEDCORE_API_KEY": "k5"}) == ["k1", "k2", "k3", "k4", "k5"]


def test_num_gpu_blocks_override_reaches_the_config():
    config = engine_config_from_args(parse("--num-gpu-blocks-override", "48"))
    assert config.num_gpu_blocks_override == 48


def test_kv_cache_memory_bytes_is_vllms_name_for_kv_cache_memory():
    assert engine_config_from_args(parse("--kv-cache-memory-bytes", "2GiB")).kv_cache_memory == "2GiB"


@pytest.mark.parametrize("argv,message", [
    (["--kv-cache-dtype", "fp8", "--device", "cuda"], "'fp8_e4m3' differs .* in-process on the CPU only"),
    (["--kv-cache-dtype", "fp8_e5m2", "-tp", "2"], "in-process on the CPU only, not with tensor"),
    (["--kv-cache-dtype", "int4"], "kv_cache_dtype must be one of auto, float32, bfloat16, fp8, fp8_e4m3"),
    (["--kv-cache-dtype", "bfloat16", "--dtype", "float32", "-tp", "2"], "in-process on the CPU only"),
    (["--cpu-offload-gb", "4"], "--cpu-offload-gb 4.0 is not supported"),
    (["--gpu-memory-utilization", "0.8"], "--gpu-memory-utilization applies to a GPU"),
    (["--kv-cache-memory", "1GiB", "--kv-cache-memory-bytes", "2GiB"], "give one"),
    (["--num-gpu-blocks-override", "0"], "num_gpu_blocks_override must be None or a positive integer"),
])
def test_cache_flags_it_cannot_honour_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        engine_config_from_args(parse(*argv))


@pytest.mark.parametrize("flag,name", [("fp8", "fp8_e4m3"), ("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2")])
def test_fp8_kv_cache_dtypes_take_vllms_names(flag, name):
    config = engine_config_from_args(parse("--kv-cache-dtype", flag))
    config.resolve_dtype("float32")
    assert config.kv_cache_dtype == name                  # vLLM: fp8 is e4m3


def test_kv_cache_dtype_reaches_the_config():
    config = engine_config_from_args(parse("--kv-cache-dtype", "bf16", "--dtype", "auto"))
    assert config.kv_cache_dtype == "bfloat16"
    config.resolve_dtype("float32")
    assert (config.dtype, config.kv_cache_dtype) == ("float32", "bfloat16")
    auto = engine_config_from_args(parse("--dtype", "auto"))
    auto.resolve_dtype("float32")
    assert auto.kv_cache_dtype == "float32"  # auto: the activations' dtype


def test_accepted_spellings_of_the_defaults_pass():
    config = engine_config_from_args(parse("--kv-cache-dtype", "auto", "--cpu-offload-gb", "0"))
    assert config.num_gpu_blocks_override is None


def test_the_override_sizes_the_kv_cache():
    from pagedcore.engine.llm_engine import LLMEngine

    engine = LLMEngine(engine_config_from_args(parse("--num-gpu-blocks-override", "40", "--max-model-len", "256",
                                                     "--dtype", "float32")))
    assert engine.view.scheduler_stats().num_free_blocks == 40


@pytest.mark.parametrize("dtype", ["half", "float16"])
def test_vllms_half_dtype_is_refused_with_what_to_use(dtype):
    """fp16 activations: no kernel computes in fp16; the message points at auto (an fp16 checkpoint's weights
    held fp16 as stored) and bfloat16."""
    with pytest.raises(ValueError, match="fp16 activations.*--dtype auto.*held fp16 as stored.*bfloat16"):
        engine_config_from_args(parse("--dtype", dtype))
    from pagedcore.model_config import dtype_name

    with pytest.raises(ValueError, match="fp16 activations"):
        dtype_name(dtype)
