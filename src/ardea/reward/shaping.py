"""Reward shaping applied after scoring: DAPO's soft overlong penalty.

Reference: Yu et al. 2025 (DAPO), eq. 13. With ``L_max`` the generation budget
(``rollout.max_new_tokens``), ``B`` the buffer (``reward.overlong_buffer``) and ``c`` the
largest penalty (``reward.overlong_penalty``), a completion of ``L`` tokens gets

    0                                 if L <= L_max - B
    c * ((L_max - B) - L) / B         if L_max - B < L <= L_max

added to its reward, so the penalty grows linearly from 0 to ``-c`` over the last ``B``
tokens of the budget. DAPO's third case (``L > L_max``: ``-c``) cannot occur here because
the engine never generates more than ``L_max`` tokens. ``B = 0`` turns shaping off.
"""

from __future__ import annotations

from collections.abc import Sequence


def overlong_penalty(
    lengths: Sequence[int], *, max_length: int, buffer: int, penalty: float = 1.0
) -> list[float]:
    """The penalty (<= 0) of each completion length (module docstring formula)."""
    if buffer < 0 or buffer > max_length:
        raise ValueError(f"overlong buffer must be in [0, max_length={max_length}], got {buffer}")
    if buffer == 0:
        return [0.0 for _ in lengths]
    start = max_length - buffer
    return [penalty * min(0.0, (start - n) / buffer) for n in lengths]
