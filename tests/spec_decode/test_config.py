"""SpeculativeConfig: vLLM's field names, bad values refused at start-up with the fix named."""

from __future__ import annotations

import argparse

import pytest

from pagedcore import LLM
from pagedcore.config import EngineConfig
from pagedcore.entrypoints.engine_args import add_engine_args, engine_config_from_args
from pagedcore.spec_decode import SpeculativeConfig


def test_dict_and_json_give_the_same_config():
    a = SpeculativeConfig.from_value({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5})
    b = SpeculativeConfig.from_value('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5}')
    assert a == b and a.num_speculative_tokens == 3 and a.prompt_lookup_min == 1
    assert EngineConfig(speculative_config={"method": "ngram"}).speculative_config.method == "ngram"
    assert EngineConfig().speculative_config is None


@pytest.mark.parametrize("value,match", [
    ({"method": "medusa2"}, "speculative_config.method must be one of 'ngram', 'draft_model', 'layer_skip'"),
    ({"method": "eagle"}, "'eagle' is not implemented"),
    ({"method": "draft_model", "draft": "x"}, "unknown field"),
    ({"method": "draft_model"}, r"speculative_config.model must be the draft model's HF folder or .gguf file"),
    ({"method": "ngram", "model": "x"}, "speculative_config.model must be None with method 'ngram'"),
    ({"method": "layer_skip"}, r"speculative_config.num_layers must be an integer >= 1"),
    ({"method": "layer_skip", "num_layers": 0}, r"num_layers must be an integer >= 1"),
    ({"method": "ngram", "num_layers": 2}, "num_layers must be None unless method is \"layer_skip\""),
    ({"method": "ngram", "quantization": "gguf"}, "quantization must be None unless method is \"draft_model\""),
    ({"method": "draft_model", "model": "x", "dtype": "float16"}, "speculative_config.dtype must be one of 'auto'"),
    ({"method": "ngram", "dtype": "float32"}, "dtype must be \"auto\" unless method is \"draft_model\""),
    ({"method": "draft_model", "model": "x", "dtype": "bfloat16", "quantization": "gguf"},
     "quantized weights run float32 activations"),
    ({"num_speculative_tokens": 2}, 'needs "method"'),
    ({"method": "ngram", "num_speculative_tokens": 0}, r"num_speculative_tokens must be an integer in \[1, 16\]"),
    ({"method": "ngram", "num_speculative_tokens": 17}, r"in \[1, 16\]"),
    ({"method": "ngram", "num_speculative_tokens": True}, r"in \[1, 16\]"),
    ({"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_max must be an integer >= prompt_lookup_min"),
    ({"method": "ngram", "prompt_lookup_min": 0}, "prompt_lookup_min must be an integer >= 1"),
    ({"method": "ngram", "disable_by_batch_size": 0}, "disable_by_batch_size"),
    ("{not json", "not valid JSON"),
    ([1, 2], "must be a dict"),
])
def test_bad_values_are_refused(value, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(speculative_config=value)


def test_cli_flag_and_budget_check(tiny_llama):
    _, folder = tiny_llama
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 6}',
                              "--max-num-batched-tokens", "6"])
    config = engine_config_from_args(args, model=folder, max_model_len=6)
    assert config.speculative_config.num_speculative_tokens == 6
    with pytest.raises(ValueError, match=r"num_speculative_tokens \(6\) \+ 1 exceeds max_num_batched_tokens \(6\)"):
        LLM.from_config(config)
    with pytest.raises(ValueError, match="unknown field"):
        engine_config_from_args(parser.parse_args(["--speculative-config", '{"method": "ngram", "k": 2}']))
