"""Train–inference mismatch: how far the behaviour log-probs the engine recorded are from
the trainer's own log-probs of the same tokens, before any update of the step.

Notation: ``(N, S)`` next-token-aligned tensors; on trained positions (``mask``)
``d = log π_trainer − log π_behaviour`` and ``r = exp(d)``; a sequence's ``D = Σ_t d_t``.
The two should agree (``d = 0``) when the engine samples from the distribution the trainer
computes: they drift apart with other kernels or precisions (a bf16 engine, a vLLM server)
or a sampling distribution the trainer does not apply.

==============================  ===============================================
``mismatch/abs_diff_mean``      ``Σ |d| / tokens``
``mismatch/abs_diff_max``       ``max |d|``
``mismatch/kl_k3``              ``Σ (r − 1 − d) / tokens``: the k3 estimate of
                                KL(behaviour ‖ trainer) from behaviour samples
                                (Schulman 2020, "Approximating KL divergence")
``mismatch/ratio_mean``         ``Σ r / tokens`` (1 when the two agree)
``mismatch/ratio_outside``      share of tokens with ``r ∉ [0.5, 2]``
``mismatch/seq_abs_diff_mean``  ``Σ_seq |D| / seqs``
``mismatch/seq_ratio_outside``  share of sequences with ``exp(D) ∉ [0.5, 2]``
==============================  ===============================================

``tokens`` and ``seqs`` (an :class:`~ardea.algo.agg.Aggregation`'s) default to this batch's
trained tokens and sequences; passing the whole step's makes micro-batches' values add up
to the step's (``_max`` takes the maximum).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ardea.algo._checks import as_mask, check_float, check_ndim, check_shape
from ardea.algo.agg import TOKEN_MEAN, Aggregation

RATIO_RANGE = (0.5, 2.0)
CORRECTION_MODES = ("token_tis", "seq_tis", "token_mis", "seq_mis")


@torch.no_grad()
def mismatch_metrics(
    logprobs: Tensor,
    behaviour: Tensor,
    mask: Tensor,
    agg: Aggregation = TOKEN_MEAN,
) -> dict[str, Tensor]:
    """The ``mismatch/*`` metrics (module docstring) as 0-d float64 tensors, per token over
    ``agg.tokens`` and per sequence over ``agg.seqs`` (None: this ``mask``'s)."""
    check_ndim("logprobs", check_float("logprobs", logprobs), 2, "(N, S)")
    check_shape("behaviour", check_float("behaviour", behaviour), logprobs.shape, "(N, S)")
    mask = as_mask("mask", mask, logprobs.shape, "(N, S)")
    d = torch.where(mask, logprobs.detach().double() - behaviour.detach().double(), 0.0)
    low, high = RATIO_RANGE
    tokens = float(mask.sum()) if agg.tokens is None else float(agg.tokens)
    trained = mask.any(dim=-1)  # (N,) rows with a trained token
    seqs = float(trained.sum()) if agg.seqs is None else float(agg.seqs)
    r = d.exp()
    outside = mask & ((r < low) | (r > high))
    total = d.sum(dim=-1)  # (N,) D per sequence
    seq_outside = trained & ((total.exp() < low) | (total.exp() > high))
    per_token, per_seq = max(tokens, 1.0), max(seqs, 1.0)
    return {
        "mismatch/abs_diff_mean": d.abs().sum() / per_token,
        "mismatch/abs_diff_max": d.abs().max() if d.numel() else d.new_zeros(()),
        "mismatch/kl_k3": torch.where(mask, r - 1.0 - d, 0.0).sum() / per_token,
        "mismatch/ratio_mean": torch.where(mask, r, 0.0).sum() / per_token,
        "mismatch/ratio_outside": outside.sum().double() / per_token,
        "mismatch/seq_abs_diff_mean": torch.where(trained, total.abs(), 0.0).sum() / per_seq,
        "mismatch/seq_ratio_outside": seq_outside.sum().double() / per_seq,
    }


@torch.no_grad()
def correction_weights(
    proximal: Tensor,
    behaviour: Tensor,
    mask: Tensor,
    *,
    mode: str,
    cap: float = 2.0,
    low: float = 0.5,
    high: float = 2.0,
) -> Tensor:
    """``(N, S)`` importance weights correcting the mismatch, 0 off ``mask``.

    With ``w = exp(log π_proximal − log π_behaviour)`` per token (``π_proximal``: the
    trainer's own log-probs before the step's updates) and ``W = exp(Σ_t d)`` per sequence:
    ``token_tis``: ``min(w, cap)``; ``seq_tis``: ``min(W, cap)`` on every token of the
    sequence; ``token_mis``: ``w`` where ``low <= w <= high``, else 0; ``seq_mis``: ``W``
    where ``low <= W <= high``, else 0 (the whole sequence). References: Yao et al. 2025,
    "Your efficient RL framework secretly brings you off-policy RL training" (TIS); the
    masked and sequence-level variants as in verl's and slime's rollout correction.
    """
    if mode not in CORRECTION_MODES:
        raise ValueError(
            f"mismatch correction mode {mode!r}; choose one of {', '.join(CORRECTION_MODES)}"
        )
    mask = as_mask("mask", mask, proximal.shape, "(N, S)")
    d = torch.where(mask, (proximal - behaviour).double(), 0.0).clamp(-20.0, 20.0)
    if mode.startswith("seq"):
        d = d.sum(dim=-1, keepdim=True).clamp(-20.0, 20.0).expand_as(d)
    w = d.exp()
    if mode.endswith("tis"):
        w = w.clamp(max=cap)
    else:
        w = torch.where((w >= low) & (w <= high), w, 0.0)
    return torch.where(mask, w, 0.0).to(proximal.dtype)
