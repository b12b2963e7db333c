"""The grammar stage of sampling: tokens a row's grammar forbids get logit -inf, in place.

Runs before every other stage (bias, penalties, temperature) and before logprobs are read, as in
vLLM: the logprobs of a constrained row describe the masked distribution (forbidden tokens -inf).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def apply_grammar_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor, row_ids: Sequence[int]) -> None:
    """logits [R, V] float (edited in place); bitmask int32 [R, ceil(V / 32)] on the CPU, bit j of row
    r set = token j allowed; row_ids: the rows to mask (the others are left as they are)."""
    import xgrammar as xgr

    if logits.device.type == "cpu":
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[1], indices=list(row_ids),
                                        backend="cpu")
        return
    # On an accelerator: one copy of the (small) bitmask, then a vectorised unpack-and-fill in torch.
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True),
                                    vocab_size=logits.shape[1], indices=list(row_ids), backend="torch_native")
