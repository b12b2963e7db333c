"""fp8 e4m3 weights with one fp32 scale per output row (ops/quant_linear.py "fp8_e4m3" / "fp8_e4m3x16",
cpp/kernels/linear.h kDenseFp8E4M3*): W8A16 on the dense kernels, on every ISA this CPU runs (the others are
SKIPPED with the reason), against a float64 torch oracle (torch.float8_e4m3fn's own decoding of the bytes):
random shapes off the tile sizes, odd K, bias, the SwiGLU epilogue, fp32 / bf16 x and out; bit for bit the
fp32 kernel's sums on the widened copy times the scale (bf16 x in the x16 layout on AVX512-BF16: bf16x16's pair-dot
sums on the bf16 copy); the x16 repack a lossless permutation; the C++ decoder
stack and the one-call decode over fp8 layers equal to the Python layer loop / forward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pagedcore import _core
from pagedcore.ops import linear as linear_ops
from pagedcore.ops.dense_repack import pack_x16
from pagedcore.ops.quant_linear import FP8_FORMATS, QuantLinearKernel, row_bytes
from pagedcore.ops.quant_repack import gather_rows_x16, repack_x16, repackable, unpack_x16

_ISAS = ("generic", "generic16", "generic16_bf16", "avx2", "avx512", "avx512_bf16", "avx512_vnni")


def _isa_params():
    params = []
    for isa in _ISAS:
        marks = [] if _core.kernel_isa_supported(isa) else [pytest.mark.skip(reason=f"this CPU cannot run {isa}")]
        params.append(pytest.param(isa, marks=marks, id=isa))
    return params


ISAS = _isa_params()


def random_e4m3(N: int, K: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 [N, K] of every e4m3 code but the NaN ones (0x7f, 0xff), which quantizers never write."""
    w = torch.randint(0, 256, (N, K), dtype=torch.uint8, generator=gen)
    return torch.where((w & 0x7F) == 0x7F, w ^ 0x01, w)


def values(w: torch.Tensor) -> torch.Tensor:
    """The e4m3 bytes as float64 (torch's decoding), unscaled."""
    return w.view(torch.float8_e4m3fn).to(torch.float64)


def layer(N: int, K: int, seed: int):
    """(w uint8 [N, K], scales fp32 [N] of both signs, bias fp32 [N])."""
    gen = torch.Generator().manual_seed(seed)
    scales = (torch.rand(N, generator=gen) * 3e-3 + 1e-3) * torch.where(torch.arange(N) % 5 == 3, -1.0, 1.0)
    return random_e4m3(N, K, gen), scales, torch.randn(N, generator=gen)


def oracle(x: torch.Tensor, w: torch.Tensor, scales, bias, silu_mul: bool, out_dtype: torch.dtype):
    """(float64 reference, float64 tolerance) of scales[n] * x[m] . W[n] (+ bias[n]) (SwiGLU: each half scaled
    by its own rows); bf16 out rounds as torch does op by op."""
    x64, w64 = x.double(), values(w)
    raw, mag = x64 @ w64.T, x64.abs() @ w64.abs().T
    ref, mag = raw * scales.double(), mag * scales.double().abs()
    if bias is not None:
        ref, mag = ref + bias.double(), mag + bias.double().abs()
    if not silu_mul:
        tol = 2e-6 * mag + 1e-6
        return ref, tol + (ref.abs() * 2 ** -8 if out_dtype is torch.bfloat16 else 0)
    half = ref.shape[1] // 2
    g, u, mg, mu = ref[:, :half], ref[:, half:], mag[:, :half], mag[:, half:]
    if out_dtype is torch.bfloat16:
        r = lambda t: t.to(torch.bfloat16).double()  # noqa: E731
        out = r(torch.nn.functional.silu(r(g))) * r(u)
        return out, 3 * out.abs() * 2 ** -8 + 2e-6 * (mg + mu) * (1 + u.abs() + g.abs()) + 1e-6
    return torch.nn.functional.silu(g) * u, 2e-6 * (mg * u.abs() + mu * (g.abs() + 1)) + 1e-6


def kernel(w, fmt, K, bias=None, *, scales, isa, **kw):
    packed = repack_x16(w, "fp8_e4m3", K) if fmt == "fp8_e4m3x16" else w
    return QuantLinearKernel(packed, fmt, K, bias, scales=scales, isa=isa, **kw)


def _shapes(fmt: str, seed: int):
    """(M, N, K): M 1 .. 20 and 33, 130; N off the tile widths (x16: whole groups); K odd at odd M, 2 mod 4 at
    M = 2, else a multiple of 4 (what the x16 layout's bf16 pair dot takes)."""
    gen = torch.Generator().manual_seed(seed)
    for M in (1, 2, 3, 5, 8, 13, 20, 33, 130):
        groups = int(torch.randint(1, 9, (1,), generator=gen))
        N = 16 * groups if fmt == "fp8_e4m3x16" else int(torch.randint(1, 150, (1,), generator=gen))
        K = int(torch.randint(1, 175, (1,), generator=gen))
        yield M, N, 4 * K + 1 if M % 2 else 4 * K + 2 if M == 2 else 4 * K


# The ISAs whose x16 kernel multiplies bf16 x on bf16 pair dot products (cpp/kernels/dense_x16_impl.h kX16Fp8Dot).
PAIR_DOT_ISAS = ("avx512_bf16", "generic16_bf16")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_kernel_matches_the_float64_oracle(isa, fmt):
    ran = []
    for i, (M, N, K) in enumerate(_shapes(fmt, seed=len(fmt) + _ISAS.index(isa))):
        w, scales, bias = layer(N, K, seed=i)
        x = torch.randn(M, K, generator=torch.Generator().manual_seed(100 + i))
        for x_dtype, out_dtype, b in [(torch.float32, torch.float32, None), (torch.float32, torch.float32, bias),
                                      (torch.bfloat16, torch.bfloat16, bias), (torch.bfloat16, torch.float32, None)]:
            xi = x.to(x_dtype)
            y = kernel(w, fmt, K, b, scales=scales, isa=isa, x_dtype=x_dtype, out_dtype=out_dtype)(xi)
            assert y.dtype is out_dtype and y.shape == (M, N)
            ref, tol = oracle(xi, w, scales, b, False, out_dtype)
            err = (y.double() - ref).abs()
            assert (err <= tol).all(), f"{fmt} {isa} M={M} N={N} K={K} {x_dtype}->{out_dtype}: max err {err.max()}"
        ran.append((M, N, K))
    print(f"{fmt} on {isa}: {ran}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_silu_mul_scales_each_half_by_its_own_rows(isa, fmt):
    for i, (M, N, K) in enumerate(_shapes(fmt, seed=7)):
        N = 2 * N  # whole halves (x16: groups of 16 per half)
        w, scales, bias = layer(N, K, seed=50 + i)
        x = torch.randn(M, K, generator=torch.Generator().manual_seed(200 + i))
        for x_dtype, out_dtype, b in ((torch.float32, torch.float32, bias), (torch.float32, torch.bfloat16, bias),
                                      (torch.float32, torch.float32, None), (torch.bfloat16, torch.bfloat16, bias)):
            xi = x.to(x_dtype)  # (bf16 x: the x16 layout's bf16 pair dot where the ISA has it)
            y = kernel(w, fmt, K, b, scales=scales, isa=isa, silu_mul=True, x_dtype=x_dtype, out_dtype=out_dtype)(xi)
            assert y.shape == (M, N // 2)
            ref, tol = oracle(xi, w, scales, b, True, out_dtype)
            err = (y.double() - ref).abs()
            assert (err <= tol).all(), f"{fmt} {isa} silu_mul M={M} N={N} K={K} {x_dtype}->{out_dtype}: {err.max()}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_the_sums_are_the_fp32_copys_times_the_scale_bit_for_bit(isa, fmt):
    """The kernel widens each byte exactly and sums in the fp32 kernel's order (rows: dense_f32's, x16:
    f32x16's); the scale is one multiply of the sum, the bias one add after it. bf16 x widens exactly too, except
    where the x16 layout meets bf16 x on the bf16 pair dot (K % 4 == 0): there the bytes become bf16 exactly and
    the sums are bf16x16's on the weights' bf16 copy."""
    x16 = fmt == "fp8_e4m3x16"
    for i, (M, N, K) in enumerate(_shapes(fmt, seed=11)):
        w, scales, bias = layer(N, K, seed=300 + i)
        w32 = values(w).float()
        x = torch.randn(M, K, generator=torch.Generator().manual_seed(400 + i)).bfloat16().float()
        raw = linear_ops.linear(x, pack_x16(w32) if x16 else w32, isa=isa, x16=x16)
        got = kernel(w, fmt, K, scales=scales, isa=isa)(x)
        assert torch.equal(got, raw * scales), f"{fmt} {isa} M={M} N={N} K={K}"
        assert torch.equal(kernel(w, fmt, K, bias, scales=scales, isa=isa)(x), raw * scales + bias)
        from_bf16 = kernel(w, fmt, K, scales=scales, isa=isa, x_dtype=torch.bfloat16, out_dtype=torch.float32)
        if x16 and isa in PAIR_DOT_ISAS and K % 4 == 0:
            raw = linear_ops.linear(x.bfloat16(), pack_x16(w32.bfloat16()), isa=isa, x16=True, out_dtype=torch.float32)
            assert torch.equal(from_bf16(x.bfloat16()), raw * scales), f"{fmt} {isa} bf16 x M={M} N={N} K={K}"
        else:
            assert torch.equal(from_bf16(x.bfloat16()), got)


@pytest.mark.parametrize("isa", ISAS)
def test_every_code_widens_exactly(isa):
    """One-hot rows of x read back each weight: all 254 non-NaN codes, subnormals and +-0 included, through
    the vector part and the scalar tail (K = 254 is no multiple of 8 or 16); and as bf16 x at K = 256."""
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)  # [254]
    w = torch.stack([codes, codes.roll(1)] * 8)  # [16, 254]
    eye = torch.eye(codes.numel())
    for fmt in FP8_FORMATS:
        got = kernel(w, fmt, codes.numel(), scales=torch.ones(16), isa=isa)(eye)  # [254, 16]: W^T
        assert torch.equal(got.double(), values(w).T), fmt
    # bf16 x, K = 256 (two zero codes more): on AVX512-BF16 the x16 layout's conversion to bf16 pairs
    w256 = torch.cat([w, torch.zeros(16, 2, dtype=torch.uint8)], dim=1)  # [16, 256]
    eye16 = torch.eye(256, dtype=torch.bfloat16)
    for fmt in FP8_FORMATS:
        got = kernel(w256, fmt, 256, scales=torch.ones(16), isa=isa, x_dtype=torch.bfloat16,
                     out_dtype=torch.float32)(eye16)  # [256, 16]: W^T
        assert torch.equal(got.double(), values(w256).T), f"{fmt} bf16 x"


def test_repack_is_a_lossless_permutation():
    gen = torch.Generator().manual_seed(3)
    N, K = 48, 37
    w = random_e4m3(N, K, gen)
    packed = repack_x16(w, "fp8_e4m3", K)
    assert packed.shape == (N, K) and packed.dtype is torch.uint8 and row_bytes("fp8_e4m3x16", K) == K
    assert torch.equal(packed.view(N // 16, K, 16), w.view(N // 16, 16, K).transpose(1, 2))  # [N/16][K][16]
    assert torch.equal(unpack_x16(packed, "fp8_e4m3x16", K), w)
    rows = torch.tensor([0, 17, 47, 17, 5, 32])
    assert torch.equal(gather_rows_x16(packed, rows, "fp8_e4m3x16", K), w[rows])
    with pytest.raises(ValueError, match="N a multiple of 16"):
        repack_x16(w[:40], "fp8_e4m3", K)


@pytest.mark.parametrize("isa", ISAS)
def test_repackable_on_every_isa_for_whole_groups(isa):
    assert repackable("fp8_e4m3", 64, isa=isa, K=37) == "fp8_e4m3x16"
    assert repackable("fp8_e4m3", 40, isa=isa) is None and repackable("fp8_e4m3", 0, isa=isa) is None
    assert repackable("fp8_e4m3x16", 64, isa=isa) is None  # (already repacked)


def test_refusals_say_what_to_change():
    w, scales, _ = layer(48, 32, seed=1)
    with pytest.raises(ValueError, match=r"needs scales: a contiguous fp32 CPU tensor of shape \(48,\)"):
        QuantLinearKernel(w, "fp8_e4m3", 32)
    with pytest.raises(ValueError, match="needs scales"):
        QuantLinearKernel(w, "fp8_e4m3", 32, scales=scales[:40])
    with pytest.raises(ValueError, match="needs scales"):
        QuantLinearKernel(w, "fp8_e4m3", 32, scales=scales.double())
    with pytest.raises(ValueError, match="whole groups of 16 rows; N = 40"):
        QuantLinearKernel(w[:40], "fp8_e4m3x16", 32, scales=scales[:40])
    with pytest.raises(ValueError, match="per SwiGLU half; N = 48"):
        QuantLinearKernel(w, "fp8_e4m3x16", 32, scales=scales, silu_mul=True)
    with pytest.raises(TypeError, match="a fp8_e4m3 weight is torch.uint8"):
        QuantLinearKernel(w.view(torch.int8), "fp8_e4m3", 32, scales=scales)
    # A float8_e4m3fn tensor is read as its bytes.
    x = torch.randn(2, 32)
    assert torch.equal(QuantLinearKernel(w.view(torch.float8_e4m3fn), "fp8_e4m3", 32, scales=scales)(x),
                       QuantLinearKernel(w, "fp8_e4m3", 32, scales=scales)(x))
    # The launcher refuses a missing scale pointer by itself (the Python check bypassed).
    handle = _core.LinearHandle(weight=w.data_ptr(), bias=0, N=48, K=32, x_dtype=0, bias_dtype=0, out_dtype=0,
                                weight_format=_core.WeightFormat.FP8_E4M3, epilogue=0)
    out = torch.empty(2, 48)
    with pytest.raises(ValueError, match="fp8_e4m3 weights need weight_scales"):
        handle(out.data_ptr(), x.data_ptr(), 2, 32, 48)


# ---- the decoder stack and the one-call decode over fp8 layers ----

def fp8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3 quantization of a float weight [N, K]: (uint8 [N, K], fp32 scales [N] = amax / 448)."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1)
    scales = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return (w / scales[:, None]).to(torch.float8_e4m3fn).view(torch.uint8).contiguous(), scales.contiguous()


def make_fp8(linear) -> None:
    """A loaded dense Linear (no bias) becomes a QuantLinearMethod layer of one fp8_e4m3 part, as an fp8
    checkpoint's layer is after loading (repacked to fp8_e4m3x16 where quant_repack says so)."""
    from pagedcore.layers.linear_quant import QuantLinearMethod, QuantPart

    assert linear.bias is None
    q, scales = fp8_rows(linear.weight)
    method = QuantLinearMethod("compressed-tensors")
    linear.method = method
    linear.weight = nn.Parameter(q, requires_grad=False)
    linear.quant_parts = [QuantPart("fp8_e4m3", 0, q.shape[0], q, scales)]
    linear.input_perm = None
    method.process_weights_after_loading(linear)


_LEAVES = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("repack", ["1", "0"], ids=["x16", "rows"])
def test_the_decoder_stack_runs_fp8_layers_as_the_layer_loop(tmp_path, monkeypatch, dtype, repack):
    from pagedcore.loader import load_model
    from tests.models import tiny_models
    from tests.models.test_decoder_stack import assert_stack_equals_loop

    monkeypatch.setenv("PAGEDCORE_QUANT_REPACK", repack)
    folder = tiny_models.save_hf_folder(tiny_models.build_hf_model("llama"), tmp_path / "llama")
    model = load_model(folder, dtype=dtype, load_tokenizer=False).model
    for layer in model.model.layers:
        for name in _LEAVES:
            make_fp8(layer.get_submodule(name))
    model.model.refresh_decoder_stack()
    assert model.decoder_stack_status.supported, model.decoder_stack_status.reason
    stack = model.model._decoder_stack()
    want = {"fp8_e4m3x16"} if repack == "1" else {"fp8_e4m3"}  # (the tiny model's rows are whole groups)
    assert set(stack.formats) == want and stack.max_rows > 128  # its own kernel at every row count
    assert_stack_equals_loop(model, f"fp8 {dtype} {want}")


def test_the_one_call_decode_runs_fp8_layers_and_head(tmp_path, monkeypatch):
    from pagedcore import LLM, SamplingParams
    from tests.models import tiny_models

    folder = tiny_models.save_hf_folder(tiny_models.build_hf_model("llama"), tmp_path / "llama")
    tiny_models.make_tokenizer().save_pretrained(folder)
    llm = LLM(folder, dtype="float32", kv_cache_memory="16MiB", max_model_len=256, max_num_batched_tokens=32)
    model = llm.llm_engine.worker.runner.model
    for layer in model.model.layers:
        for name in _LEAVES:
            make_fp8(layer.get_submodule(name))
    make_fp8(model.lm_head)
    model.model.refresh_decoder_stack()
    prompts = [{"prompt_token_ids": p} for p in ([5, 9, 23, 7], [11, 3, 40, 41, 42, 8, 19], [100])]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    fused = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert model.greedy_decoder() is not None, model.greedy_decode_reason
    assert model.greedy_decoder().tensors[3].weight_format == "fp8_e4m3x16"  # the head's kernel
    monkeypatch.setenv("PAGEDCORE_GREEDY_DECODE", "0")
    python = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert model.greedy_decoder() is None and fused == python
