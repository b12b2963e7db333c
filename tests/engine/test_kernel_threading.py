"""The kernels' threading the engine picks per model (ops/kernel_threading.py): the pool where every linear
layer runs our kernels, the library default (OpenMP) where library GEMMs run in steps, the env var over both."""

from __future__ import annotations

import pytest

from pagedcore import LLM, SamplingParams, _core
from pagedcore.ops import kernel_threading as kt


@pytest.fixture(autouse=True)
def restore_threading(monkeypatch):
    monkeypatch.delenv(kt.ENV_VAR, raising=False)
    saved = _core.kernel_threading()
    yield
    _core.set_kernel_threading(saved)


def _engine(folder, **kwargs):
    return LLM(folder, max_model_len=128, kv_cache_memory="4MiB", **kwargs).llm_engine


def test_quantized_layers_run_on_the_pool(tiny_llama):
    _, folder = tiny_llama
    _core.set_kernel_threading("openmp")
    engine = _engine(folder, quantization="int8_per_channel")
    assert kt.library_gemm_layers(engine.loaded.model) == []
    assert engine.worker.runner.kernel_threading == "pool"
    assert _core.kernel_threading() == "pool"


def test_checkpoint_layout_dense_layers_keep_the_library_default(tiny_llama, monkeypatch):
    _, folder = tiny_llama
    monkeypatch.setenv("PAGEDCORE_DENSE_REPACK", "0")   # dense weights as stored: many rows go to torch
    _core.set_kernel_threading("pool")
    engine = _engine(folder)
    names = kt.library_gemm_layers(engine.loaded.model)
    assert any(name.endswith("qkv_proj") for name in names) and any(name.endswith("down_proj") for name in names)
    assert engine.worker.runner.kernel_threading == kt.LIBRARY_DEFAULT == _core.kernel_threading()


def test_the_env_var_overrides_the_choice_and_a_bad_value_names_the_fix(tiny_llama, monkeypatch):
    _, folder = tiny_llama
    _core.set_kernel_threading("openmp")
    if _core.kernel_threading() != "openmp":
        pytest.skip("a build without OpenMP always runs the pool")
    monkeypatch.setenv(kt.ENV_VAR, "openmp")
    assert _engine(folder, quantization="int8_per_channel").worker.runner.kernel_threading == "openmp"
    monkeypatch.setenv(kt.ENV_VAR, "fibers")
    with pytest.raises(ValueError, match="set 'pool'.*or 'openmp'"):
        _engine(folder, quantization="int8_per_channel")


def test_both_threadings_give_the_same_tokens(tiny_llama):
    _, folder = tiny_llama
    llm = LLM(folder, max_model_len=128, kv_cache_memory="4MiB", quantization="int8_per_channel")
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 17, 40)]
    tokens = {}
    for threading in ("pool", "openmp"):
        _core.set_kernel_threading(threading)
        tokens[threading] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens["pool"] == tokens["openmp"]


def test_a_draft_and_its_target_choose_together(tiny_llama, monkeypatch):
    """The draft's runner (built last) decides for both models: a quantized target with a draft whose dense
    layers call library GEMMs keeps the library default; with the draft quantized too, the pool."""
    _, folder = tiny_llama
    monkeypatch.setenv("PAGEDCORE_DENSE_REPACK", "0")
    spec = {"method": "draft_model", "model": folder, "num_speculative_tokens": 2}
    engine = _engine(folder, quantization="int8_per_channel", speculative_config=spec)
    assert engine.worker.runner.kernel_threading == "pool"          # the target's runner, alone
    assert engine.draft.runner.kernel_threading == kt.LIBRARY_DEFAULT == _core.kernel_threading()
    quantized = _engine(folder, quantization="int8_per_channel",
                        speculative_config=dict(spec, quantization="int8_per_channel"))
    assert quantized.draft.runner.kernel_threading == "pool" == _core.kernel_threading()
    assert kt.choose(quantized.loaded.model, engine.draft.model) == kt.LIBRARY_DEFAULT
