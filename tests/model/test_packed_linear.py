"""The engine's linear with a weight packed once: bf16 products bit-equal to ``F.linear``'s,
float32 products within the rounding bound of a float32 dot product, a row's output
independent of the rows beside it, strided inputs read as what they hold."""

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


@needs_bf16
@pytest.mark.parametrize(("rows", "inner", "out"), [(64, 96, 160), (5, 64, 40), (1, 32, 96)])
@pytest.mark.parametrize("bias", [True, False])
def test_bfloat16_products_equal_f_linear_bit_for_bit(rows, inner, out, bias):
    x, w, b = operands(rows, inner, out, torch.bfloat16, bias)
    layer = PackedLinear(w, b)
    assert layer.packed is not None and layer.weight is None  # one copy: the packed one
    assert torch.equal(layer(x), F.linear(x, w, b))


@needs_onednn
@pytest.mark.parametrize("rows", [3, 64])
def test_float32_products_within_the_dot_product_rounding_bound(rows):
    """|ŷ − y| ≤ γ_K Σ|x_k w_k| + u|y| for a K-term float32 dot product (γ_K = K u / (1 − K
    u), u = 2⁻²⁴) plus the bias addition's rounding, against a float64 reference; F.linear
    (MKL) is held to the same bound."""
    inner = 96
    x, w, b = operands(rows, inner, 80, torch.float32)
    exact = F.linear(x.double(), w.double(), b.double())
    u = 2.0**-24
    gamma = (inner + 1) * u / (1 - (inner + 1) * u)
    bound = gamma * (x.double().abs() @ w.double().abs().T + b.double().abs()) + u * exact.abs()
    for got in (PackedLinear(w, b)(x), F.linear(x, w, b)):
        assert got.dtype == torch.float32
        assert bool(((got.double() - exact).abs() <= bound).all())


@needs_onednn
@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=needs_bf16), torch.float32])
def test_a_rows_output_does_not_depend_on_the_rows_beside_it(dtype):
    """Batched generation samples each row as if alone: row i of a 37-row product is
    row i of the same product over any prefix of the rows (1, 2, 7 and 8 rows: MKL's
    float32 sgemm changes kernels at 8)."""
    x, w, b = operands(37, 64, 48, dtype)
    layer = PackedLinear(w, b)
    full = layer(x)
    for rows in (1, 2, 7, 8, 20):
        assert torch.equal(layer(x[:rows]), full[:rows])


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
    x, w, b = operands(4, 32, 16, torch.bfloat16)
    out = PackedLinear(w, b)(x.float())  # float32 input, bf16 weight: computed in bf16
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, F.linear(x.float().bfloat16(), w, b))


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
    assert torch.equal(layer(x), F.linear(x, w, b))
