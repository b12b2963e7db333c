"""The LoRA flags and config: vLLM's names, both --lora-modules forms, and the refusals."""

from __future__ import annotations

import pytest

from pagedcore.config import EngineConfig
from pagedcore.lora import LoRAError, LoRARequest
from pagedcore.serving.cli import parse_lora_modules


def test_lora_modules_both_forms():
    got = parse_lora_modules(["sql=/a/sql", '{"name": "chat", "path": "/a/chat", "base_model_name": "smol"}'])
    assert got == [LoRARequest("sql", 1, "/a/sql"), LoRARequest("chat", 2, "/a/chat", "smol")]
    assert parse_lora_modules(None) == []


@pytest.mark.parametrize("value, message", [
    ("sql", "name=path"), ("=/a", "name=path"), ('{"name": "x"}', '"name" and "path"'), ("{bad", "not valid JSON")])
def test_lora_modules_refused(value, message):
    with pytest.raises(ValueError, match=message):
        parse_lora_modules([value])


def test_lora_modules_duplicate_names():
    with pytest.raises(ValueError, match="twice"):
        parse_lora_modules(["a=/x", "a=/y"])


def test_engine_config():
    assert EngineConfig(enable_lora=True, max_loras=3).max_cpu_loras == 3
    with pytest.raises(ValueError, match="max_cpu_loras"):
        EngineConfig(enable_lora=True, max_loras=4, max_cpu_loras=2)
    with pytest.raises(ValueError, match="max_lora_rank"):
        EngineConfig(max_lora_rank=0)
    with pytest.raises(ValueError, match="CPU only"):
        EngineConfig(enable_lora=True, device="cuda")


def test_lora_request_validates():
    with pytest.raises(LoRAError, match="lora_int_id"):
        LoRARequest("a", 0, "/x")
    with pytest.raises(LoRAError, match="lora_name"):
        LoRARequest("", 1, "/x")
    r = LoRARequest("a", 3, "/x")
    assert (r.adapter_id, r.name, r.path) == (3, "a", "/x")


def test_serve_flags_parse():
    import argparse

    from pagedcore.entrypoints.engine_args import engine_config_from_args
    from pagedcore.serving.cli import add_serve_parser

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "32",
                              "--max-cpu-loras", "5", "--lora-modules", "a=/x", "b=/y"])
    config = engine_config_from_args(args)
    assert (config.enable_lora, config.max_loras, config.max_lora_rank, config.max_cpu_loras) == (True, 2, 32, 5)
    assert [r.lora_name for r in parse_lora_modules(args.lora_modules)] == ["a", "b"]


def test_lora_request_without_enable_lora_is_refused(tiny_base):
    from pagedcore import LLM, SamplingParams

    llm = LLM(tiny_base[1], max_model_len=64)
    with pytest.raises(ValueError, match="--enable-lora"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False, lora_request=LoRARequest("a", 1, "/x"))
    assert llm.llm_engine.num_unfinished_requests == 0
