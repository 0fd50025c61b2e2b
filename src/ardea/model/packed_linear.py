"""A linear layer whose weight is laid out once for the CPU's matmul library (oneDNN), for
weights that change rarely and are multiplied often: the in-process engine's decode step,
between two weight updates.

``torch.nn.functional.linear`` hands a bf16 weight to oneDNN as a plain row-major matrix,
which oneDNN lays out again on every call, and a float32 weight to MKL's sgemm, which takes
its AVX2 code path on AMD processors. Laying the weight out once
(``torch.ops.mkldnn._reorder_linear_weight``) and multiplying with
``torch.ops.mkldnn._linear_pointwise`` measured, at a decode step's shapes (64 rows against
384 × 384 … 384 × 2304 weights; ``benchmarks/README.md``), 1.4–1.7× faster in bf16 and
2.0–2.5× in float32 on an AMD Zen 5 (1.2–1.5× in float32 with oneDNN and MKL held to AVX2).

Numbers: both kernels accumulate in float32 and round once, so outputs agree to that
rounding (in bf16 they were bit-equal to ``F.linear``'s on the AVX-512 BF16 CPUs measured;
another CPU's kernels may sum in another order); in float32 oneDNN sums in another order
than MKL (relative differences ~1e-6 at these widths; on the Zen 5 measured, unlike MKL's,
which changes kernels below 8 rows, a row's output did not depend on how many rows were
multiplied with it). ``tests/model/test_packed_linear.py`` holds both kernels to the
rounding bound. Other devices, other dtypes, bf16 where oneDNN has no bf16 kernels (AVX2
only, where bf16 is emulated) and a torch without oneDNN keep ``F.linear``. oneDNN reads a
packed weight's input as a contiguous matrix whatever its strides (a strided view gives
wrong numbers), so inputs are made contiguous first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

PACK_ROWS = 64  # the row count oneDNN lays the weight out for; any row count is accepted


def can_pack(weight: Tensor) -> bool:
    """Whether ``weight`` gets a packed layout: a float32 CPU tensor, or a bf16 one where
    oneDNN has bf16 kernels (AVX-512 BW/VL/DQ or AVX-NE-CONVERT: on an AVX2-only CPU, or one
    held to AVX2, its reorder refuses bf16), and a torch with oneDNN."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float32):
        return False
    if not torch.backends.mkldnn.is_available() or not hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    ):
        return False
    return weight.dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear:
    """``x Wᵀ + b`` in the weight's dtype, with ``W`` packed once when :func:`can_pack`.

    Args:
        weight: (out, in) in the compute dtype (detached; a copy the caller owns).
        bias: (out,) in the same dtype, or None.

    Calling it with ``x (..., in)`` of any dtype returns ``(..., out)`` in the weight's dtype.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        self.dtype, self.bias = weight.dtype, bias
        # once packed, the plain weight is not kept: the packed copy is the only one
        self.packed = (
            torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS) if can_pack(weight) else None
        )
        self.weight = weight if self.packed is None else None

    def __call__(self, x: Tensor) -> Tensor:
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self.packed, self.bias, "none", [], ""
        )
