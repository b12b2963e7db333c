"""A GGUF file -> ModelConfig, HF-named weights (block bytes kept, or dequantised; Q/K rows
un-permuted) and tokenizer.

llama.cpp's converter reorders the rows of Llama's Q and K projections so that each head's two
RoPE halves interleave (its rope pairs adjacent dims; HF's rotate_half pairs dim i with i + d/2):

    HF rows of one head:    [x0 x1 ... x(d/2-1) | y0 y1 ... y(d/2-1)]      (halves)
    GGUF rows of one head:  [x0 y0 x1 y1 ... ]                              (pairs)

We undo it per head: view the rows as [heads, d/2, 2] and swap the last two axes back. Only the
"llama" architecture is permuted; llama.cpp writes Qwen2/Qwen3 rows in HF order already. A row of
a quantized tensor is a whole number of blocks along the input dim, so the same permutation moves
whole rows of block bytes ([rows, row_bytes] uint8) when the blocks are kept.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from pagedcore.loader.errors import ModelLoadError
from pagedcore.loader.gguf_dequant import (BLOCK_FORMATS, FLOAT_TYPES, SUPPORTED_TYPES, dequantize, dequantize_into,
                                           dequantize_rows, is_supported, row_bytes)
from pagedcore.loader.gguf_file import GGUFFile, GGUFTensorInfo
from pagedcore.loader.gguf_held_as import HELD_AS, held_rows
from pagedcore.model_config import ModelConfig
from pagedcore.models.llama import ROPE_FREQ_FACTORS
from pagedcore.models.registry import GGUF_ARCHITECTURES

_log = logging.getLogger(__name__)

# GGUF tensor name -> HF name.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": ROPE_FREQ_FACTORS,
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise ModelLoadError(f"GGUF tensor {gguf_name!r} is not part of a Llama/Qwen2/Qwen3 model")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"


def config_from_gguf(gguf: GGUFFile, dtype: str) -> ModelConfig:
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(f"{gguf.path} holds a {arch!r} model; pagedcore runs GGUF architectures "
                             f"{sorted(GGUF_ARCHITECTURES)}")
    for info in gguf.tensors.values():  # before any work: name every unsupported tensor type at once
        if not is_supported(info.ggml_type):
            bad = sorted({i.type_name for i in gguf.tensors.values() if not is_supported(i.ggml_type)})
            raise ModelLoadError(f"{gguf.path} has tensors of type {bad} (e.g. {info.name!r}); pagedcore "
                                 f"dequantises {list(SUPPORTED_TYPES)}: use a GGUF of one of those types")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{gguf.path} lacks metadata {arch}.{key}, which the model needs")
        return value

    num_heads = get("attention.head_count")
    num_kv_heads = get("attention.head_count_kv", num_heads)
    if isinstance(num_kv_heads, list):
        raise ModelLoadError(f"{gguf.path} has a different number of KV heads per layer; not supported")
    hidden_size = get("embedding_length")
    head_dim = get("attention.key_length", hidden_size // num_heads)
    if get("rope.dimension_count", head_dim) != head_dim:
        raise ModelLoadError(f"{gguf.path} rotates {get('rope.dimension_count')} of {head_dim} head dims "
                             "(partial RoPE); pagedcore supports full-head RoPE only")
    tokens = meta.get("tokenizer.ggml.tokens", ())
    vocab_size = meta.get(f"{arch}.vocab_size") or len(tokens) or gguf.tensors["token_embd.weight"].shape[0]
    eos_ids = [meta[f"tokenizer.ggml.{key}"] for key in ("eos_token_id", "eot_token_id", "eom_token_id")
               if f"tokenizer.ggml.{key}" in meta]  # llama.cpp stops on all of them
    return ModelConfig(
        architecture=GGUF_ARCHITECTURES[arch],
        hidden_size=hidden_size,
        intermediate_size=get("feed_forward_length"),
        num_layers=get("block_count"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        vocab_size=vocab_size,
        rms_norm_eps=get("attention.layer_norm_rms_epsilon"),
        rope_theta=get("rope.freq_base", 10000.0),
        rope_scaling=_rope_scaling(gguf, arch),
        max_position_embeddings=get("context_length"),
        tie_word_embeddings="output.weight" not in gguf.tensors,
        attention_bias="blk.0.attn_q.bias" in gguf.tensors,
        qk_norm="blk.0.attn_q_norm.weight" in gguf.tensors,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(eos_ids)),
        dtype=dtype,
    )


def _rope_scaling(gguf: GGUFFile, arch: str) -> dict[str, Any] | None:
    rope_type = gguf.metadata.get(f"{arch}.rope.scaling.type", "none")
    if rope_type == "none":
        return None  # Llama 3.1 files keep their rescaling in the rope_freqs tensor instead
    if rope_type == "linear":
        return {"rope_type": "linear", "factor": gguf.metadata[f"{arch}.rope.scaling.factor"]}
    raise ModelLoadError(f"{gguf.path} uses RoPE scaling {rope_type!r}; pagedcore supports none and linear "
                         "in GGUF files (and llama3 through rope_freqs)")


class GGUFWeight:
    """One tensor still in the file (a LazyWeight): load_into decodes it straight into a float
    parameter; with keep_blocks, a quantized tensor also offers its block bytes (block_rows), and
    the receiving layer keeps them (layers/linear_quant.py, layers/embedding.py)."""

    def __init__(self, gguf: GGUFFile, info: GGUFTensorInfo, permuted_heads: int | None, keep_blocks: bool):
        self.shape = info.shape  # [out, in] / [dim]
        self._gguf = gguf
        self._info = info
        self._permuted_heads = permuted_heads  # llama.cpp's Q/K row order over this many heads, or None
        # The kernels' name of the block format ("q4_1", ...) when the layer should keep the blocks;
        # None: a float tensor, or a model dequantised at load (--dtype float32|bfloat16).
        self.block_format = BLOCK_FORMATS.get(info.ggml_type) if keep_blocks else None

    @property
    def ggml_type(self):
        return self._info.ggml_type

    @property
    def source_dtype(self) -> torch.dtype | None:
        """The torch dtype of a float tensor (F32 / F16 / BF16) as the file stores it, else None: a layer
        or table of an F16 / BF16 tensor is held in that dtype (layers/linear_quant.py, layers/embedding.py)."""
        return FLOAT_TYPES.get(self._info.ggml_type)

    def block_rows(self) -> torch.Tensor:
        """The tensor's bytes as uint8 [out, row_bytes], rows in HF order; a copy (the map's pages
        are not held: the layer owns its bytes, and the file cache may drop them)."""
        rows = self._gguf.raw(self._info).view(self.shape[0], row_bytes(self._info.ggml_type, self.shape[-1]))
        if self._info.ggml_type in HELD_AS:  # Q3_K / IQ4_NL: converted exactly into the kernels' Q6_K / Q8_0
            rows = held_rows(rows, self._info.ggml_type)
        if self._permuted_heads is not None:
            return _unpermute_rows(rows, self._permuted_heads).contiguous()
        return rows.clone() if self._info.ggml_type not in HELD_AS else rows

    def load_into(self, out: torch.Tensor) -> None:
        raw = self._gguf.raw(self._info)  # uint8 view of the map
        if self._permuted_heads is None and out.is_contiguous():
            dequantize_into(raw, self._info.ggml_type, out)
            return
        tensor = dequantize(raw, self._info.ggml_type, self.shape)  # fp32 temporary (Q/K: small)
        if self._permuted_heads is not None:
            tensor = _unpermute_rows(tensor, self._permuted_heads)
        out.copy_(tensor)

    def cut_error(self, dim: int, start: int, length: int) -> str | None:
        """Why [start, start + length) along dim cannot be this tensor's kept blocks, or None: an input (dim 1)
        cut must fall on the format's block boundaries (32 weights; 256 for the k-quants), a row cut of a
        permuted Q/K on whole heads. A dequantised tensor cuts anywhere (None)."""
        if self.block_format is None or len(self.shape) != 2:
            return None
        if dim == 1:
            block_elems = GGML_QUANT_SIZES[self._info.ggml_type][0]
            if start % block_elems or length % block_elems:
                return (f"{self._info.name} ({self._info.ggml_type.name}, blocks of {block_elems} inputs) would be "
                        f"cut at inputs [{start}, {start + length}), inside a block")
        elif self._permuted_heads and (start % (head_rows := self.shape[0] // self._permuted_heads)
                                       or length % head_rows):
            return f"{self._info.name} would be cut at rows [{start}, {start + length}), inside a head"
        return None

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor | GGUFBlockSlice:
        """Rows [start, start + length) along dim, rows in HF order: a tensor-parallel rank's part.
        Kept blocks (keep_blocks): a GGUFBlockSlice of the same bytes, whole rows (dim 0) or whole blocks of every
        row (dim 1; cut_error says where that is impossible). Dequantised: blocks pack along the input dim (dim 1),
        so a dim-0 cut decodes only its rows (whole heads of a permuted Q/K: the permutation stays inside a head);
        a dim-1 cut decodes the whole tensor (one fp32 temporary, kept by the slice until it is copied)."""
        if self.block_format is not None and len(self.shape) == 2:
            return self._block_slice(dim, start, length)
        head_rows = self.shape[0] // self._permuted_heads if self._permuted_heads else 1
        if dim == 0 and start % head_rows == 0 and length % head_rows == 0:
            nbytes = row_bytes(self._info.ggml_type, self.shape[-1]) if len(self.shape) > 1 else None
            if nbytes is not None:
                rows = self._gguf.raw(self._info).view(self.shape[0], nbytes)[start:start + length]  # uint8
                tensor = dequantize(rows.reshape(-1), self._info.ggml_type, (length, *self.shape[1:]))
                if self._permuted_heads is not None:
                    tensor = _unpermute_rows(tensor, length // head_rows)
                return tensor
        tensor = dequantize(self._gguf.raw(self._info), self._info.ggml_type, self.shape)  # fp32 [out, in]
        if self._permuted_heads is not None:
            tensor = _unpermute_rows(tensor, self._permuted_heads)
        return tensor.narrow(dim, start, length)

    def _block_slice(self, dim: int, start: int, length: int) -> GGUFBlockSlice:
        error = self.cut_error(dim, start, length)
        if error is not None:
            raise ValueError(f"{error}; {BLOCK_CUT_FIX}")
        file_rows = self._gguf.raw(self._info).view(self.shape[0], -1)  # uint8 [N, row_bytes], the map's pages
        if dim == 0:
            rows = file_rows[start:start + length]  # uint8 [length, row_bytes]
            if self._permuted_heads is not None:  # whole heads (cut_error): un-permuted inside each
                rows = _unpermute_rows(rows, length // (self.shape[0] // self._permuted_heads))
            shape = (length, self.shape[1])
        elif dim == 1:
            block_elems, block_bytes = GGML_QUANT_SIZES[self._info.ggml_type]
            first, end = start // block_elems * block_bytes, (start + length) // block_elems * block_bytes
            rows = file_rows[:, first:end]  # uint8 [N, cut bytes]: each row's blocks of these inputs
            if self._permuted_heads is not None:
                rows = _unpermute_rows(rows, self._permuted_heads)
            shape = (self.shape[0], length)
        else:
            raise ValueError(f"{self._info.name}: a 2-d tensor is cut along dim 0 or 1, not {dim}")
        # A copy (as block_rows): the layer owns its bytes, not the map's pages.
        return GGUFBlockSlice(rows.clone(memory_format=torch.contiguous_format), shape, self._info.ggml_type,
                              self.block_format)


class GGUFBlockSlice:
    """A tensor-parallel rank's cut of a GGUF tensor whose blocks are kept (GGUFWeight.narrow): its own bytes,
    offered to the layers as a GGUFWeight offers all of them (block_rows, block_format)."""

    source_dtype = None

    def __init__(self, rows: torch.Tensor, shape: tuple[int, int], ggml_type, block_format: str):
        self._rows = rows  # uint8 [shape[0], row_bytes(ggml_type, shape[1])]
        self.shape = shape
        self.ggml_type = ggml_type
        self.block_format = block_format

    def block_rows(self) -> torch.Tensor:
        return held_rows(self._rows, self.ggml_type) if self.ggml_type in HELD_AS else self._rows

    def load_into(self, out: torch.Tensor) -> None:
        out.copy_(dequantize_rows(self._rows, self.ggml_type))


# What to do when a kept-block tensor cannot be cut for tensor parallelism.
BLOCK_CUT_FIX = ("choose a --tensor-parallel-size that cuts the heads and the intermediate size on whole blocks, or "
                 "pass --dtype float32|bfloat16 (dequantised at load: cuts anywhere)")


def weights_from_gguf(gguf: GGUFFile, config: ModelConfig,
                      keep_blocks: bool = False) -> Iterator[tuple[str, GGUFWeight]]:
    """(HF name, lazy weight) for every tensor of the file; each is read once, when loaded.
    keep_blocks: quantized tensors offer their block bytes to the layers (see GGUFWeight)."""
    permuted = gguf.metadata["general.architecture"] == "llama"
    converted = sorted({info.type_name for info in gguf.tensors.values() if info.ggml_type in HELD_AS})
    if keep_blocks and converted:
        _log.info("%s: %s tensors held as %s blocks (converted exactly at load, ~1.9x their file bytes; "
                  "loader/gguf_held_as.py)", gguf.path, "/".join(converted),
                  "/".join(sorted({HELD_AS[T[name]].upper() for name in converted})))
    for info in gguf.tensors.values():
        name = hf_name(info.name)
        heads = None
        if permuted and ".q_proj." in name:
            heads = config.num_heads
        elif permuted and ".k_proj." in name:
            heads = config.num_kv_heads
        yield name, GGUFWeight(gguf, info, heads, keep_blocks)


def _unpermute_rows(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[num_heads * head_dim, ...] from llama.cpp's interleaved RoPE pairs back to HF halves (see top)."""
    rows = tensor.shape[0]
    rest = tensor.shape[1:]
    pairs = tensor.reshape(num_heads, rows // num_heads // 2, 2, *rest)  # [heads, d/2, 2, ...]
    return pairs.transpose(1, 2).reshape(rows, *rest)  # [heads, 2, d/2, ...] flattened
