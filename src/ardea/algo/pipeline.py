"""The advantage pipeline: from a trajectory batch's rows to advantages and returns.

Alignment is decided once, by whoever builds :class:`AdvantageInputs` (the trajectory
batch, :meth:`ardea.data.TrajectoryBatch.advantage_inputs`): every ``(N, S)`` field is
**next-token aligned**, column ``t`` describing the step that emits token ``t + 1``, the way a
causal LM's outputs line up (``values[:, t]`` = V of the state after tokens ``0..t``; trainer
log-probs ``out[:, t] = log p(input_ids[:, t+1] | input_ids[:, :t+1])``). A token-aligned
field ``x`` (column ``t`` describes token ``t``) becomes next-token aligned with
:func:`next_token_align` (``out[:, t] = x[:, t+1]``, last column filled).

Steps (reference: the PPO actor of the seed documents; Ouyang et al. 2022 for the KL
reward; per-step formulas in the called functions):

1. outcome score ``s = clip((reward + reward_bias) * reward_scaling, -reward_clip,
   reward_clip)``, optionally normalized over the batch or group (``reward_norm``), and 0
   for truncated rows when ``mask_no_eos_with_zero``;
2. per-token KL reward ``-kl_ctl * kl_penalty(logprobs, ref_logprobs, kl_estimator)`` on
   trained positions; per-token process rewards (``process_rewards``, e.g. a teacher's) are
   passed on beside it, for the estimator to keep with their tokens;
3. the score placed at the last trained position of each row;
4. lambda: a number is used as is (no per-batch context); a dotted path gets the
   per-trajectory lengths (:func:`ardea.algo.lambda_fn.build_lambda_context`);
5. the configured advantage estimator, then optional advantage whitening (``adv_norm``);
   advantages and returns are 0 outside the trained positions.

Deviations from the seed: the shift fills the last column instead of rolling the first
column around (identical whenever column 0 is a prompt token); the outcome reward goes to
the last *trained* position (the seed's ``seqlen - 2`` is the same position for rows that end
with a generated token, and a row that ends in tool output keeps its reward); a row with
no trained token gets no placed reward; the bootstrap value is read at the row's last real
token (``values[:, seqlen - 1]``, equal to the seed's last column for full rows);
``kl_ctl > 0`` without ``ref_logprobs`` is an error instead of a KL against zeros.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ardea.algo._checks import as_mask, check_finite, check_float, check_shape, check_tensor
from ardea.algo.advantages import AdvantageOutputs, EstimatorInputs, get_advantage_estimator
from ardea.algo.kl import kl_penalty
from ardea.algo.lambda_fn import build_lambda_context, check_lambda_output, resolve_gae_lambda_fn
from ardea.algo.normalize import masked_whiten, normalize_scores


def next_token_align(x: Tensor, fill: float | int = 0) -> Tensor:
    """Token-aligned ``(N, S)`` -> next-token aligned: ``out[:, t] = x[:, t + 1]``.

    The last column, which would describe a token after the sequence, is ``fill``.
    Equals ``torch.roll(x, -1, dims=-1)`` whenever ``x[:, 0] == fill``.
    """
    out = torch.empty_like(x)
    out[..., :-1] = x[..., 1:]
    out[..., -1:] = fill
    return out


def place_outcome(scores: Tensor, mask: Tensor) -> Tensor:
    """Put ``scores (N,)`` at the last True position of each row of ``mask (N, S)``.

    Returns ``(N, S)`` zeros elsewhere; a row without a True position gets nothing.
    """
    positions = torch.arange(mask.shape[-1], device=mask.device)
    last = torch.where(mask, positions, -1).amax(dim=-1) if mask.shape[-1] else None  # (N,)
    out = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    if last is None:
        return out
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = scores[rows]
    return out


@dataclass(frozen=True)
class AdvantageInputs:
    """What :func:`compute_advantages` reads: ``N`` right-padded rows of ``S`` columns, every
    ``(N, S)`` field next-token aligned (module docstring). Validated when built.

    Attributes:
        mask: ``(N, S)`` bool (or 0/1), True where the step emits a trained token.
        logprobs: ``(N, S)`` float behaviour log-probs of the emitted tokens (read only for
            the KL reward; values off ``mask`` are ignored, NaN included).
        rewards: ``(N,)`` float outcome reward per row.
        lengths: ``(N,)`` integer count of real tokens per row (the bootstrap value is read
            at column ``length - 1``; a row with ``length == S`` counts as truncated when
            ``no_eos`` is None).
        ref_logprobs: ``(N, S)`` float reference log-probs, or None (then ``kl_ctl`` must be 0).
        values: ``(N, S)`` float critic values ``V`` after tokens ``0..t``, or None (zeros).
        turn_ids: ``(N, S)`` integer assistant turn of the emitted token, -1 elsewhere, or
            None (then turn units are an error).
        group_ids: ``(N,)`` integer prompt group per row, or None (then group-based
            estimators and normalisations are an error).
        no_eos: ``(N,)`` bool, the row ended at the length limit, or None (see ``lengths``).
        process_rewards: ``(N, S)`` float per-token rewards of the emitted tokens (a
            process reward model's, a teacher's ``-coef * KL``), or None;
            :class:`~ardea.algo.EstimatorInputs` says how each estimator uses them.
    """

    mask: Tensor
    logprobs: Tensor
    rewards: Tensor
    lengths: Tensor
    ref_logprobs: Tensor | None = None
    values: Tensor | None = None
    turn_ids: Tensor | None = None
    group_ids: Tensor | None = None
    no_eos: Tensor | None = None
    process_rewards: Tensor | None = None

    def __post_init__(self) -> None:
        mask = check_tensor("AdvantageInputs.mask", self.mask)
        if mask.dim() != 2:
            raise ValueError(
                f"AdvantageInputs.mask must have shape (N, S), got {tuple(mask.shape)}"
            )
        mask = as_mask("AdvantageInputs.mask", mask, mask.shape, "(N, S)")
        object.__setattr__(self, "mask", mask)
        for name, per_token, kind in _FIELDS:
            value = getattr(self, name)
            if value is not None:
                shape = tuple(mask.shape) if per_token else (mask.shape[0],)
                _check_field(f"AdvantageInputs.{name}", value, shape, kind, mask)
        if self.no_eos is not None:
            no_eos = as_mask("AdvantageInputs.no_eos", self.no_eos, (mask.shape[0],), "(N,)")
            object.__setattr__(self, "no_eos", no_eos)

    @property
    def dtype(self) -> torch.dtype:
        """float64 when a per-token float input is float64, else float32 (the arithmetic's)."""
        floats = (self.logprobs, self.ref_logprobs, self.values, self.process_rewards)
        wide = any(x is not None and x.dtype == torch.float64 for x in floats)
        return torch.float64 if wide else torch.float32


#: (field, per token (N, S) or per row (N,), float or integer) of AdvantageInputs
_FIELDS = (
    ("logprobs", True, "float"),
    ("rewards", False, "float"),
    ("lengths", False, "integer"),
    ("ref_logprobs", True, "float"),
    ("values", True, "float"),
    ("turn_ids", True, "integer"),
    ("group_ids", False, "integer"),
    ("process_rewards", True, "float"),
)


def _check_field(name: str, value: object, shape: tuple, kind: str, mask: Tensor) -> None:
    """Shape and dtype of one field; floats finite (log-probs only where ``mask``)."""
    dims = "(N, S)" if len(shape) == 2 else "(N,)"
    value = check_float(name, value) if kind == "float" else check_tensor(name, value)
    check_shape(name, value, shape, dims)
    if kind == "float":
        per_token = name.endswith(("logprobs", "process_rewards"))  # finite where trained
        check_finite(name, value, where=mask if per_token else None)
    elif value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise ValueError(f"{name} must have an integer dtype, got {value.dtype}")


def shape_scores(rewards: Tensor, config: Any, group_ids: Tensor | None) -> Tensor:
    """Step 1: ``clip((r + bias) * scaling, -clip, clip)`` then ``reward_norm``; ``(N,)``."""
    scores = (rewards + config.reward_bias) * config.reward_scaling
    scores = scores.clamp(-config.reward_clip, config.reward_clip)
    return normalize_scores(scores, config.reward_norm, group_ids)


def _gae_lambda(config: Any, inputs: AdvantageInputs) -> float | Tensor:
    """Step 4: the static number itself, or one lambda per trajectory from a function."""
    fn, is_custom = resolve_gae_lambda_fn(config.gae_lambda)
    if not is_custom:
        return float(config.gae_lambda)
    context = build_lambda_context(inputs.mask, inputs.turn_ids, config.gae_timestep_unit)
    kwargs = dict(config.gae_lambda_kwargs or {})
    lam = check_lambda_output(fn(context, **kwargs), inputs.mask.shape[0])
    return lam.to(inputs.dtype)


def _kl_rewards(config: Any, inputs: AdvantageInputs) -> Tensor:
    """Step 2: ``-kl_ctl * KL`` on trained positions, ``(N, S)``."""
    mask, dtype = inputs.mask, inputs.dtype
    if config.kl_ctl == 0:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    if inputs.ref_logprobs is None:
        raise ValueError(
            f"kl_ctl={config.kl_ctl} needs reference log-probs (AdvantageInputs.ref_logprobs)"
        )
    logprobs = torch.where(mask, inputs.logprobs.to(dtype), 0.0)
    reference = torch.where(mask, inputs.ref_logprobs.to(dtype), 0.0)
    kl = kl_penalty(logprobs, reference, config.kl_estimator)
    return torch.where(mask, -config.kl_ctl * kl, 0.0)


def _estimator_inputs(config: Any, inputs: AdvantageInputs) -> EstimatorInputs:
    """Steps 1-4: shaped scores, KL rewards, placed outcome, lambda, bootstrap values."""
    mask, dtype = inputs.mask, inputs.dtype
    rows, length = mask.shape
    no_eos = inputs.no_eos if inputs.no_eos is not None else inputs.lengths == length
    if inputs.values is None:
        values = torch.zeros((rows, length), dtype=dtype, device=mask.device)
    else:
        values = inputs.values.to(dtype)
    last_token = (inputs.lengths - 1).clamp(min=0).long()[:, None]  # values[:, t] = V after t
    bootstrap = values.gather(1, last_token).squeeze(1) if length else values.new_zeros(rows)
    scores = shape_scores(inputs.rewards.to(dtype), config, inputs.group_ids)
    if config.mask_no_eos_with_zero:
        scores = torch.where(no_eos, 0.0, scores)
    return EstimatorInputs(
        task_rewards=place_outcome(scores, mask),
        kl_rewards=_kl_rewards(config, inputs),
        scores=scores,
        loss_mask=mask,
        values=values,
        group_ids=inputs.group_ids,
        seq_no_eos_mask=no_eos,
        bootstrap_values=bootstrap,
        discount=float(config.discount),
        gae_lambda=_gae_lambda(config, inputs),
        timestep_unit=config.gae_timestep_unit,
        turn_ids=inputs.turn_ids,
        process_rewards=None
        if inputs.process_rewards is None
        else torch.where(mask, inputs.process_rewards.to(dtype), 0.0),
    )


@torch.no_grad()
def compute_advantages(inputs: AdvantageInputs, config: Any) -> AdvantageOutputs:
    """Advantages and returns of a batch's rows (module docstring for the steps).

    Args:
        inputs: the rows, next-token aligned (:class:`AdvantageInputs`).
        config: a :class:`ardea.config.PPOConfig`, which validated its values when it was
            built (any object with its fields works; its values are taken as they are).

    Returns:
        :class:`ardea.algo.AdvantageOutputs`: next-token-aligned ``(N, S)`` ``advantages``
        and ``returns`` (the critic's targets for ``gae``), 0 off ``inputs.mask``, in
        float64 when any float input is float64, else float32.

    Raises:
        ValueError: a non-finite static ``gae_lambda``, turn units without ``turn_ids``,
            ``kl_ctl > 0`` without reference log-probs, group normalisation without
            ``group_ids``, an unknown estimator.
    """
    estimator = get_advantage_estimator(config.adv_estimator or "gae")
    if config.gae_timestep_unit == "turn" and inputs.turn_ids is None:
        raise ValueError(
            "gae_timestep_unit='turn' requires rollout data with per-token turn_ids "
            "(AdvantageInputs.turn_ids)"
        )
    advantages, returns = estimator(_estimator_inputs(config, inputs))
    if config.adv_norm != "none":
        groups = inputs.group_ids if config.adv_norm == "group" else None
        if config.adv_norm == "group" and groups is None:
            raise ValueError("adv_norm='group' needs group_ids (AdvantageInputs.group_ids)")
        advantages = masked_whiten(advantages, inputs.mask, groups)
    return AdvantageOutputs(advantages, returns)
