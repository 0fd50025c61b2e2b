"""The engine's linear with a weight packed once: products within the rounding bound of a
float32-accumulated dot product (then rounded once to the weight's dtype), strided inputs
read as what they hold, bf16 left to F.linear where oneDNN has no bf16 kernels."""

import pytest
import torch
import torch.nn.functional as F

from ardea.model.packed_linear import PackedLinear, can_pack

ONEDNN = torch.backends.mkldnn.is_available()
needs_onednn = pytest.mark.skipif(not ONEDNN, reason="this torch has no oneDNN: nothing is packed")
BF16 = ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()
needs_bf16 = pytest.mark.skipif(not BF16, reason="oneDNN has no bf16 kernels on this CPU (AVX2)")


def operands(rows: int, inner: int, out: int, dtype: torch.dtype, bias: bool = True):
    gen = torch.Generator().manual_seed(rows * 7 + inner)
    x = torch.randn(rows, inner, generator=gen).to(dtype)
    w = (torch.randn(out, inner, generator=gen) / inner**0.5).to(dtype)
    b = torch.randn(out, generator=gen).to(dtype) if bias else None
    return x, w, b


def within_rounding(got, x, w, b, output_unit: float) -> bool:
    """|ŷ − y| ≤ E (1 + u_out) + u_out |y| against a float64 reference y: a K-term dot
    product and the bias accumulated in float32 to within E = γ_{K+1} (Σ|x_k w_k| + |b|)
    (γ_n = n u / (1 − n u), u = 2⁻²⁴), that sum a then rounded once to the output's dtype
    (unit roundoff ``output_unit``): |round(a) − y| ≤ u_out |a| + E ≤ u_out (|y| + E) + E."""
    x64, w64 = x.double(), w.double()
    b64 = b.double() if b is not None else torch.zeros(w.shape[0], dtype=torch.float64)
    exact = x64 @ w64.T + b64
    u, n = 2.0**-24, x.shape[-1] + 1
    gamma = n * u / (1 - n * u)
    accumulated = gamma * (x64.abs() @ w64.abs().T + b64.abs())
    bound = accumulated * (1 + output_unit) + output_unit * exact.abs()
    return bool(((got.double() - exact).abs() <= bound).all())


@needs_bf16
@pytest.mark.parametrize(("rows", "inner", "out"), [(64, 96, 160), (5, 64, 40), (1, 32, 96)])
@pytest.mark.parametrize("bias", [True, False])
def test_bfloat16_products_within_the_rounding_of_f_linears(rows, inner, out, bias):
    """Packed and plain bf16 products both within float32 accumulation plus one bf16
    rounding (u = 2⁻⁸) of the exact product; the packed layer keeps no plain copy."""
    x, w, b = operands(rows, inner, out, torch.bfloat16, bias)
    layer = PackedLinear(w, b)
    assert layer.packed is not None and layer.weight is None  # one copy: the packed one
    for got in (layer(x), F.linear(x, w, b)):
        assert got.dtype == torch.bfloat16
        assert within_rounding(got, x, w, b, 2.0**-8)


@needs_onednn
@pytest.mark.parametrize("rows", [3, 64])
def test_float32_products_within_the_dot_product_rounding_bound(rows):
    """The same bound in float32 (output rounding u = 2⁻²⁴); F.linear (MKL) is held to it
    too."""
    x, w, b = operands(rows, 96, 80, torch.float32)
    for got in (PackedLinear(w, b)(x), F.linear(x, w, b)):
        assert got.dtype == torch.float32
        assert within_rounding(got, x, w, b, 2.0**-24)


@needs_onednn
def test_a_strided_input_is_read_as_what_it_holds():
    """oneDNN reads a packed weight's input as contiguous memory: a column slice (row
    stride twice its width) must give the slice's products, not its neighbours'."""
    x, w, b = operands(16, 64, 32, torch.float32)
    wide = torch.cat([x, -x], dim=1)  # (16, 128)
    view = wide[:, :64]
    assert not view.is_contiguous()
    layer = PackedLinear(w, b)
    assert torch.equal(layer(view), layer(x))


def test_inputs_are_cast_to_the_weights_dtype():
    """A float32 input to a bf16 layer is the same product as its bf16 cast (the same layer
    and kernel both times, so bit for bit on any CPU)."""
    x, w, b = operands(4, 32, 16, torch.bfloat16)
    layer = PackedLinear(w, b)
    out = layer(x.float())
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, layer(x.float().bfloat16()))


def test_what_cannot_be_packed_keeps_f_linear():
    """float64 weights (and any device but the CPU) are not packed: the plain weight is
    kept and F.linear computes the product."""
    x, w, b = operands(6, 32, 16, torch.float64)
    assert not can_pack(w)
    layer = PackedLinear(w, b)
    assert layer.packed is None and layer.weight is w
    assert torch.equal(layer(x), F.linear(x, w, b))


def test_bf16_is_packed_only_where_onednn_has_bf16_kernels():
    """On an AVX2-only CPU (or one held to AVX2) oneDNN's reorder refuses bf16: such weights
    keep F.linear instead of failing the engine."""
    x, w, b = operands(4, 32, 16, torch.bfloat16)
    layer = PackedLinear(w, b)
    assert (layer.packed is not None) == BF16
    assert within_rounding(layer(x), x, w, b, 2.0**-8)  # either kernel: the same bound
