"""The advantage pipeline: from a full-sequence trajectory batch to advantages and returns.

Layouts. A ``TrajectoryBatch`` holds right-padded ``(N, S)`` rows (prompt + everything
generated after it). Two alignments appear:

- token-aligned: column ``t`` describes token ``input_ids[:, t]`` (``loss_mask``,
  ``logprobs`` = log p(input_ids[:, t]), ``turn_ids``, ``ref_logp``);
- next-token-aligned: column ``t`` describes the step that emits token ``t + 1``, which is
  how a causal LM's outputs line up (``values[:, t]`` = V of the state after tokens ``0..t``;
  trainer log-probs ``out[:, t] = log p(input_ids[:, t+1] | input_ids[:, :t+1])``).

:func:`compute_advantages` converts the token-aligned keys once with
:func:`next_token_align` (``out[:, t] = x[:, t+1]``, last column filled with 0 / -1) and
returns everything it adds next-token aligned.

Steps (reference: the PPO actor of the seed documents; Ouyang et al. 2022 for the KL
reward; per-step formulas in the called functions):

1. outcome score ``s = clip((reward + reward_bias) * reward_scaling, -reward_clip,
   reward_clip)``, optionally normalized over the batch or group (``reward_norm``), and 0
   for truncated rows when ``mask_no_eos_with_zero``;
2. per-token KL reward ``-kl_ctl * kl_penalty(logprobs, ref_logp, kl_estimator)`` on trained
   positions;
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
``kl_ctl > 0`` without ``ref_logp`` is an error instead of a KL against zeros.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ardea.algo._checks import as_mask, check_finite, check_float, check_shape, check_tensor
from ardea.algo.advantages import AdvantageInputs, get_advantage_estimator
from ardea.algo.kl import kl_penalty
from ardea.algo.lambda_fn import build_lambda_context, check_lambda_output, resolve_gae_lambda_fn
from ardea.algo.normalize import masked_whiten, normalize_scores

REQUIRED_KEYS = ("attention_mask", "loss_mask", "logprobs", "rewards")
OUTPUT_KEYS = (
    "advantages",
    "returns",
    "kl_rewards",
    "tot_rewards",
    "next_loss_mask",
    "next_logprobs",
)


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


def shape_scores(rewards: Tensor, config: Any, group_ids: Tensor | None) -> Tensor:
    """Step 1: ``clip((r + bias) * scaling, -clip, clip)`` then ``reward_norm``; ``(N,)``."""
    scores = (rewards + config.reward_bias) * config.reward_scaling
    scores = scores.clamp(-config.reward_clip, config.reward_clip)
    return normalize_scores(scores, config.reward_norm, group_ids)


def _float(batch: Mapping[str, Tensor], key: str, shape, dims: str, dtype) -> Tensor:
    x = check_float(f"batch[{key!r}]", batch[key])
    check_shape(f"batch[{key!r}]", x, shape, dims)
    return x.to(dtype)


def _read_batch(batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Validate the keys the pipeline reads and convert them to next-token alignment."""
    missing = [k for k in REQUIRED_KEYS if k not in batch]
    if missing:
        raise ValueError(f"compute_advantages: batch is missing keys {missing}")
    mask = check_tensor("batch['loss_mask']", batch["loss_mask"])
    if mask.dim() != 2:
        raise ValueError(f"batch['loss_mask'] must have shape (N, S), got {tuple(mask.shape)}")
    shape, (rows, _) = mask.shape, mask.shape
    loss_mask = as_mask("batch['loss_mask']", mask, shape, "(N, S)")
    attention = as_mask("batch['attention_mask']", batch["attention_mask"], shape, "(N, S)")
    floats = [getattr(batch.get(k), "dtype", None) for k in ("logprobs", "values", "ref_logp")]
    dtype = torch.float64 if torch.float64 in floats else torch.float32
    logprobs = _float(batch, "logprobs", shape, "(N, S)", dtype)
    check_finite("batch['logprobs']", logprobs, where=loss_mask)
    out = {"loss_mask": next_token_align(loss_mask, False), "attention_mask": attention}
    out["logprobs"] = next_token_align(torch.where(loss_mask, logprobs, 0.0))
    out["rewards"] = _float(batch, "rewards", (rows,), "(N,)", dtype)
    check_finite("batch['rewards']", out["rewards"])
    if batch.get("ref_logp") is not None:
        ref = _float(batch, "ref_logp", shape, "(N, S)", dtype)
        check_finite("batch['ref_logp']", ref, where=loss_mask)
        out["ref_logp"] = next_token_align(torch.where(loss_mask, ref, 0.0))
    if batch.get("values") is not None:  # already next-token aligned
        out["values"] = _float(batch, "values", shape, "(N, S)", dtype)
        check_finite("batch['values']", out["values"])
    if batch.get("turn_ids") is not None:
        turn_ids = check_tensor("batch['turn_ids']", batch["turn_ids"])
        check_shape("batch['turn_ids']", turn_ids, shape, "(N, S)")
        if turn_ids.is_floating_point() or turn_ids.dtype == torch.bool:
            raise ValueError(f"batch['turn_ids'] must have an integer dtype, got {turn_ids.dtype}")
        out["turn_ids"] = next_token_align(turn_ids, -1)
    if batch.get("group_ids") is not None:
        out["group_ids"] = check_tensor("batch['group_ids']", batch["group_ids"])
        check_shape("batch['group_ids']", out["group_ids"], (rows,), "(N,)")
    if batch.get("no_eos") is not None:
        out["no_eos"] = as_mask("batch['no_eos']", batch["no_eos"], (rows,), "(N,)")
    return out


def _gae_lambda(config: Any, data: dict[str, Tensor]) -> float | Tensor:
    """Step 4: the static number itself, or one lambda per trajectory from a function."""
    fn, is_custom = resolve_gae_lambda_fn(config.gae_lambda)
    if not is_custom:
        return float(config.gae_lambda)
    context = build_lambda_context(
        data["loss_mask"], data.get("turn_ids"), config.gae_timestep_unit
    )
    kwargs = dict(config.gae_lambda_kwargs or {})
    lam = check_lambda_output(fn(context, **kwargs), data["loss_mask"].shape[0])
    return lam.to(data["logprobs"].dtype)


def _kl_rewards(config: Any, data: dict[str, Tensor]) -> Tensor:
    """Step 2: ``-kl_ctl * KL`` on trained positions, ``(N, S)``."""
    mask, logprobs = data["loss_mask"], data["logprobs"]
    if config.kl_ctl == 0:
        return torch.zeros_like(logprobs)
    if "ref_logp" not in data:
        raise ValueError(
            f"kl_ctl={config.kl_ctl} needs reference log-probs in batch['ref_logp'] (N, S)"
        )
    kl = kl_penalty(logprobs, data["ref_logp"], config.kl_estimator)
    return torch.where(mask, -config.kl_ctl * kl, 0.0)


def _estimator_inputs(config: Any, data: dict[str, Tensor]) -> AdvantageInputs:
    """Steps 1-4: shaped scores, KL rewards, placed outcome, lambda, bootstrap values."""
    mask, dtype = data["loss_mask"], data["logprobs"].dtype
    rows, length = mask.shape
    gae_lambda = _gae_lambda(config, data)
    seqlen = data["attention_mask"].sum(dim=-1)  # (N,)
    no_eos = data.get("no_eos", seqlen == length)
    values = data.get("values", torch.zeros((rows, length), dtype=dtype, device=mask.device))
    last_token = (seqlen - 1).clamp(min=0)[:, None]  # values[:, t] = V after token t
    bootstrap = values.gather(1, last_token).squeeze(1) if length else values.new_zeros(rows)
    scores = shape_scores(data["rewards"], config, data.get("group_ids"))
    if config.mask_no_eos_with_zero:
        scores = torch.where(no_eos, 0.0, scores)
    return AdvantageInputs(
        task_rewards=place_outcome(scores, mask),
        kl_rewards=_kl_rewards(config, data),
        scores=scores,
        loss_mask=mask,
        values=values,
        group_ids=data.get("group_ids"),
        seq_no_eos_mask=no_eos,
        bootstrap_values=bootstrap,
        discount=float(config.discount),
        gae_lambda=gae_lambda,
        timestep_unit=config.gae_timestep_unit,
        turn_ids=data.get("turn_ids"),
    )


@torch.no_grad()
def compute_advantages(batch: Mapping[str, Tensor], config: Any) -> Any:
    """Advantages, returns and reward terms for a trajectory batch.

    Args:
        batch: mapping of right-padded rows: token-aligned ``(N, S)`` ``loss_mask``,
            ``attention_mask``, ``logprobs`` (behaviour log-probs), per-trajectory
            ``rewards (N,)``, and optionally ``ref_logp`` (token-aligned), ``values``
            (next-token aligned), ``turn_ids`` (token-aligned), ``group_ids (N,)``,
            ``no_eos (N,)`` (default: rows filling all ``S`` columns count as truncated).
        config: a :class:`ardea.config.PPOConfig`, which validated its values when it was
            built (any object with its fields works; its values are taken as they are).

    Returns:
        A shallow copy of ``batch`` with these next-token-aligned ``(N, S)`` entries added:
        ``advantages``, ``returns``, ``kl_rewards`` (``-kl_ctl * KL``), ``tot_rewards``
        (outcome + KL reward), ``next_loss_mask`` (bool) and ``next_logprobs`` (behaviour
        log-probs), so that the loss never re-aligns anything.

    Raises:
        ValueError: missing keys, wrong shapes or dtypes, non-finite values, a non-finite
            static ``gae_lambda``, turn units without ``turn_ids``, unknown estimator.
    """
    estimator = get_advantage_estimator(config.adv_estimator or "gae")
    data = _read_batch(batch)
    mask = data["loss_mask"]
    if config.gae_timestep_unit == "turn" and "turn_ids" not in data:
        raise ValueError(
            "gae_timestep_unit='turn' requires rollout data with per-token turn_ids "
            "(batch['turn_ids'])"
        )
    inputs = _estimator_inputs(config, data)
    advantages, returns = estimator(inputs)
    if config.adv_norm != "none":
        groups = data.get("group_ids") if config.adv_norm == "group" else None
        if config.adv_norm == "group" and groups is None:
            raise ValueError("adv_norm='group' needs batch['group_ids'] (N,)")
        advantages = masked_whiten(advantages, mask, groups)
    out = copy.copy(batch)
    out["advantages"] = advantages
    out["returns"] = returns
    out["kl_rewards"] = inputs.kl_rewards
    out["tot_rewards"] = inputs.total_rewards
    out["next_loss_mask"] = mask
    out["next_logprobs"] = data["logprobs"]
    return out
