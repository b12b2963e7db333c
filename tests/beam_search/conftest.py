"""Fixtures for beam search: a tiny random Llama (HF folder, fp32), a copy of it whose EOS is a token
the model really picks (so hypotheses end inside the window), and HF transformers' beam search."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

import pytest
import torch

from tests.models import tiny_models


@dataclass
class HFBeam:
    token_ids: list[int]          # generated tokens, EOS included when it ended there
    cumulative_logprob: float     # recovered from HF's score: score * length ** length_penalty
    score: float                  # HF's sequences_scores entry


def hf_beam_search(hf_model, prompt: list[int], beam_width: int, max_tokens: int, eos_token_ids: list[int],
                   length_penalty: float = 1.0, early_stopping: bool | str = False) -> list[HFBeam]:
    """HF generate(num_beams=W, num_return_sequences=W, do_sample=False) on one prompt (batch of one)."""
    from transformers import GenerationConfig

    config = GenerationConfig(num_beams=beam_width, num_return_sequences=beam_width, do_sample=False,
                              max_new_tokens=max_tokens, length_penalty=length_penalty,
                              early_stopping=early_stopping, eos_token_id=eos_token_ids or None, pad_token_id=0,
                              output_scores=True, return_dict_in_generate=True)
    # One thread: generate() on a model this small is all per-step overhead, and on a shared machine
    # more threads only wait on each other (20x slower under load).
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([prompt]), generation_config=config)
    finally:
        torch.set_num_threads(num_threads)
    beams = []
    for i in range(beam_width):
        length = int((out.beam_indices[i] != -1).sum())   # its generated length (shorter ones are padded)
        score = float(out.sequences_scores[i])
        beams.append(HFBeam(out.sequences[i, len(prompt):len(prompt) + length].tolist(),
                            score * length ** length_penalty, score))
    return beams


def held_prompts(num: int = 3, seed: int = 7) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, tiny_models.VOCAB_SIZE, (int(n),), generator=g).tolist()
            for n in torch.randint(5, 40, (num,), generator=g)]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """(hf_model, folder) of the tiny random Llama; its EOS (id 2) practically never comes up."""
    hf_model = tiny_models.build_hf_model("llama")
    folder = tiny_models.save_hf_folder(hf_model, tmp_path_factory.mktemp("beam_tiny_llama"))
    return hf_model, folder


@pytest.fixture(scope="session")
def tiny_llama_eos(tiny_llama, tmp_path_factory):
    """(hf_model, folder, eos id): the same weights with EOS set to a token beams pick early, so
    hypotheses end inside the window."""
    hf_model, folder = tiny_llama
    # The best W=2 beam of held_prompts()[0] reads 348 198 380 165 364 ...: with 364 as EOS, hypotheses
    # of 5 tokens end in the window for W=2 and W=4 (found by scanning the beams' tokens; the tests
    # check that some hypothesis really ends early).
    eos = 364
    copy = tmp_path_factory.mktemp("beam_tiny_llama_eos")
    shutil.copytree(folder, copy, dirs_exist_ok=True)
    gen_path = copy / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    gen["eos_token_id"] = eos
    gen_path.write_text(json.dumps(gen))
    return hf_model, str(copy), eos
