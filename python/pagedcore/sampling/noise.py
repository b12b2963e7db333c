"""The random draw of the sampler: the exponential race.

argmax_i(w_i / E_i) with E_i ~ Exponential(1) i.i.d. picks i with probability w_i / sum(w) (w >= 0,
unnormalised is fine). Each row's noise comes from that row's own generator when it has one, so a
seeded request draws the same noise whatever else shares its batch; unseeded rows share the global one.
"""

from __future__ import annotations

import torch

# Tokens per block in block_race: about sqrt(vocab) for the vocabularies we serve, so a row draws
# ~2 * sqrt(V) noise values instead of V.
BLOCK_SIZE = 256


def exponential_noise(num_rows: int, width: int, generators: dict[int, torch.Generator],
                      device: torch.device | str = "cpu") -> torch.Tensor:
    """Exponential(1) noise [num_rows, width] float32; row r uses generators[r] when present."""
    noise = torch.empty(num_rows, width, dtype=torch.float32, device=device)  # [num_rows, width]
    if len(generators) < num_rows:
        noise.uniform_()  # global generator; seeded rows are overwritten below
    for row, generator in generators.items():
        noise[row].uniform_(generator=generator)
    # -log(U) ~ Exponential(1). Built from uniform_ because torch's CPU exponential_ is ~4x slower
    # (scalar log1p in double). U in [0, 1): U = 0 gives E = +inf, which only ever loses the race
    # (w / inf = 0), and E > 0 always, so w = 0 never yields 0/0 = NaN.
    return noise.log_().neg_()


def exponential_race(weights: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Sample one column per row of weights [num_rows, width] (>= 0; consumed in place) -> [num_rows] int64."""
    num_rows, width = weights.shape
    noise = exponential_noise(num_rows, width, generators, weights.device)  # [num_rows, width]
    return weights.div_(noise).argmax(dim=-1)  # [num_rows]


def block_race(weights: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Sample one token per row of weights [U, V] (>= 0, not modified) in two exact races: a block of
    BLOCK_SIZE tokens by its total weight, then a token inside it. P(token) = W_block/W * w/W_block.

        weights [U, V]:  | block 0 | block 1 | ... | block B-1 | tail (V mod BLOCK_SIZE) |
        masses  [U, B(+1)] = per-block sums (a strided view, no copy)
        noise   [U, B(+1) + BLOCK_SIZE]: first the block race, then the race inside the chosen block
    """
    num_rows, vocab_size = weights.shape
    num_full = vocab_size // BLOCK_SIZE
    body = num_full * BLOCK_SIZE
    parts = []
    if num_full:
        parts.append(weights[:, :body].unflatten(1, (num_full, BLOCK_SIZE)).sum(dim=-1))  # [U, B]
    if body < vocab_size:
        parts.append(weights[:, body:].sum(dim=-1, keepdim=True))  # [U, 1] the short tail block
    masses = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # [U, NB]
    num_blocks = masses.shape[1]
    # One draw of fixed width per row, so a seeded row consumes the same noise in any batch.
    noise = exponential_noise(num_rows, num_blocks + BLOCK_SIZE, generators, weights.device)  # [U, NB + BS]
    block = masses.div_(noise[:, :num_blocks]).argmax(dim=-1)  # [U]
    cols = block.unsqueeze(1) * BLOCK_SIZE + torch.arange(BLOCK_SIZE, device=weights.device)  # [U, BS]
    inside = weights.gather(1, cols.clamp(max=vocab_size - 1))  # [U, BS]
    inside.masked_fill_(cols >= vocab_size, 0.0)  # past the end of a short tail block
    return block * BLOCK_SIZE + inside.div_(noise[:, num_blocks:]).argmax(dim=-1)  # [U]


def subset_generators(generators: dict[int, torch.Generator], row_ids: list[int]) -> dict[int, torch.Generator]:
    """Re-key generators for the sub-batch made of rows row_ids (new position -> generator)."""
    if not generators:
        return {}
    return {pos: generators[row] for pos, row in enumerate(row_ids) if row in generators}
