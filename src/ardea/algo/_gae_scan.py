"""The one implementation of the GAE recurrence, shared by token-, turn- and response-level GAE.

For each row ``b`` of ``[M, T]`` tensors, walking ``t = T-2, ..., 0`` backwards
(column ``T-1`` is the bootstrap slot and always gets advantage 0)::

    delta_t   = (r_t + gamma * nv) - v_t
    a_t       = delta_t + c_b * a                 c_b = gamma * lambda_b
    if mask_t: nv, a = v_t, a_t                   (masked steps carry nv and a unchanged)
    out_t     = a

with ``nv`` starting at ``next_values[b]`` and ``a`` at 0. The float operations happen in
exactly this order and dtype (no fused multiply-add), so the result is bit-identical to
the column-by-column PyTorch loop of the seed's legacy recurrence.

Two back ends compute the same numbers: the compiled C loop of :mod:`ardea.algo._ckernel`
(float32/float64, when a C compiler is available) and :func:`scan_torch`, a PyTorch loop
over columns vectorised over rows. The recurrence is inherently sequential in ``t``; at
``T`` in the thousands the PyTorch loop is dominated by per-column dispatch overhead,
which the C loop removes. Nothing here is differentiable: GAE targets are constants.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ardea.algo._ckernel import c_kernel_available, scan_c


def scan_torch(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    next_values: Tensor,
    coef: Tensor,
    discount: float,
) -> Tensor:
    """The recurrence as a PyTorch loop over columns (reference and fallback back end)."""
    rows, cols = rewards.shape
    r_cols = rewards.t().contiguous().unbind(0)  # T tensors of shape (M,)
    v_cols = values.t().contiguous().unbind(0)
    m_cols = mask.t().contiguous().unbind(0)
    out = torch.zeros((cols, rows), dtype=rewards.dtype, device=rewards.device)
    out_cols = out.unbind(0)
    nv = next_values.clone()
    tmp = torch.empty_like(nv)
    new = torch.empty_like(nv)
    for t in range(cols - 2, -1, -1):
        torch.mul(nv, discount, out=tmp)  # gamma * nv, scalar cast to the tensor dtype
        torch.add(r_cols[t], tmp, out=new)
        torch.sub(new, v_cols[t], out=new)  # delta = (r + gamma * nv) - v
        torch.mul(coef, out_cols[t + 1], out=tmp)
        torch.add(new, tmp, out=new)  # a = delta + c * a_next
        torch.where(m_cols[t], new, out_cols[t + 1], out=out_cols[t])
        torch.where(m_cols[t], v_cols[t], nv, out=nv)
    return out.t().contiguous()


@torch.no_grad()
def gae_scan(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    next_values: Tensor,
    coef: Tensor,
    discount: float,
    *,
    backend: str = "auto",
) -> Tensor:
    """Run the backward GAE recurrence on validated inputs.

    Args:
        rewards, values: ``(M, T)`` tensors of one floating dtype.
        mask: ``(M, T)`` bool; False steps carry the running value and advantage.
        next_values: ``(M,)`` value after the last column (already zero where no bootstrap).
        coef: ``(M,)`` per-row ``gamma * lambda`` in the tensors' dtype.
        discount: ``gamma`` as a Python float.
        backend: ``"auto"`` (C when available), ``"c"`` or ``"torch"``.

    Returns:
        ``(M, T)`` advantages; column ``T-1`` is 0.
    """
    if rewards.shape[-1] == 0:
        return torch.zeros_like(rewards)
    if backend not in ("auto", "c", "torch"):
        raise ValueError(f"backend must be 'auto', 'c' or 'torch', got {backend!r}")
    if backend != "torch" and c_kernel_available(rewards.dtype):
        return scan_c(rewards, values, mask, next_values, coef, discount)
    if backend == "c":
        raise RuntimeError(
            "the compiled GAE kernel is unavailable (needs float32/float64 inputs and a C "
            "compiler `cc`; unset ARDEA_DISABLE_C_KERNEL)"
        )
    return scan_torch(rewards, values, mask, next_values, coef, discount)
