"""The one trajectory layout: :class:`TrajectoryBatch`, built from segments.

Notation: ``N`` trajectories (rows), ``S`` columns (rows right-padded to the longest).

A trajectory is one row: a prompt followed by everything after it, any number of
**segments** (:class:`Segment`) of three kinds:

    prompt      the text the model answers             loss_mask 0, turn id -1
    generated   tokens the policy produced (or a       loss_mask 1, turn id k for the k-th
                demonstration it is trained to          generated span, its behaviour
                produce)                               log-probs and policy version
    context     tool output, an environment reply,     loss_mask 0, turn id -1
                the next user message

A single-turn rollout is ``[prompt, generated]``; an agent episode alternates generated and
context spans; SFT data marks its answer spans as generated (without log-probs).

Alignment. The fields of the batch are **token-aligned**: column ``t`` describes token
``input_ids[:, t]`` (``loss_mask``, ``logprobs`` = log π_behav(input_ids[:, t] | ...),
``turn_ids``, ``versions``). A causal LM's outputs are **next-token aligned**: column ``t``
describes the step that emits token ``t + 1`` (trainer log-probs, critic values). What a
strategy pins on a batch (``advantages``, ``returns``, ``old_values``,
``proximal_logprobs``, ``ref_logprobs``) is next-token aligned, as the model's outputs and
:func:`ardea.algo.compute_advantages`' results are. :attr:`TrajectoryBatch.action_mask` and
:attr:`TrajectoryBatch.behaviour_logprobs` are the token-aligned fields in that alignment;
they (through :func:`ardea.algo.next_token_align`) are the only conversion.

Every batch is validated when it is built (shapes, dtypes, masks, turn ids, versions);
an error names the field and, where it is one row's fault, the row. Its copies (rows
selected, moved to a device, trimmed, stacked) are not checked again, and pinned fields only
for their shapes and dtypes, so a training step makes no device sync per micro-batch for
validation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from ardea.algo import AdvantageInputs, next_token_align
from ardea.data.segments import Segment, Trajectory, row_lists
from ardea.data.trajectory_checks import PINNED_FIELDS, check_pinned, validate

__all__ = ["Segment", "Trajectory", "TrajectoryBatch", "action_positions", "turn_ids_from_mask"]
_PAD = {
    "turn_ids": -1,
    "versions": -1,
    "routed_experts": -1,
}  # padding of token fields other than input_ids (0)


@dataclass(frozen=True)
class TrajectoryBatch:
    """Right-padded trajectories, one per row (module docstring for the alignment).

    Token-aligned ``(N, S)``: ``input_ids`` (long), ``attention_mask`` (long, 1 on real
    tokens, a prefix of each row), ``loss_mask`` (bool, 1 on trained tokens), ``logprobs``
    (float32 behaviour log-probs on generated tokens, 0 elsewhere; None when the data has
    none), ``turn_ids`` (long, assistant turn on generated tokens, -1 elsewhere),
    ``versions`` (long, policy version of generated tokens, -1 elsewhere), and
    ``position_ids`` (packed rows only: positions restarting at 0 per document; the model
    then gets no attention mask), and ``(N, S, L, K)`` ``routed_experts`` (integer: the experts
    each of the ``L`` MoE layers routed the token to when the engine ran it, -1 where it did
    not; rollouts of a run with ``algo.moe_routing_replay``, replayed by every forward of the
    rows: :mod:`ardea.model.routing_replay`). Per row ``(N,)``: ``rewards`` (float32), ``group_ids``
    (long), ``no_eos`` (bool). ``temperature``, ``top_k``, ``top_p``: the distribution the
    behaviour log-probs describe (the softmax at that temperature, truncated to its top-k /
    top-p set; 0 and 1 = no truncation); the trainer's log-probs use the same
    (:meth:`sampling`).

    Pinned by strategies, next-token aligned ``(N, S)`` float: ``advantages``,
    ``returns``, ``old_values`` (critic at rollout time), ``proximal_logprobs`` (decoupled
    PPO), ``ref_logprobs`` (frozen reference), ``process_rewards`` (per-token rewards of the
    trained tokens, a distillation teacher's); ``(N, S, k)``: ``teacher_top_ids`` (long)
    and ``teacher_top_logprobs`` (float), a distillation teacher's k most likely next
    tokens. Build with :meth:`from_trajectories` or the data layer's ``collate_*``; add
    pinned fields with :meth:`pin`.
    """

    input_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    turn_ids: Tensor
    versions: Tensor
    rewards: Tensor
    group_ids: Tensor
    no_eos: Tensor
    logprobs: Tensor | None = None
    position_ids: Tensor | None = None
    routed_experts: Tensor | None = None
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    advantages: Tensor | None = None
    returns: Tensor | None = None
    old_values: Tensor | None = None
    proximal_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    process_rewards: Tensor | None = None
    teacher_top_ids: Tensor | None = None
    teacher_top_logprobs: Tensor | None = None

    def __post_init__(self) -> None:
        validate(self)

    # ------------------------------------------------------------------ build
    @classmethod
    def from_tensors(
        cls,
        input_ids: Tensor,
        attention_mask: Tensor,
        loss_mask: Tensor,
        **fields: Tensor | float | None,
    ) -> TrajectoryBatch:
        """A batch from token tensors; missing fields get their neutral values: turn ``k``
        on the ``k``-th run of trained tokens of a row (-1 elsewhere), versions -1, rewards
        0, one group per row, no_eos False."""
        rows = input_ids.shape[0]
        loss_mask = loss_mask.bool()
        defaults = {
            "turn_ids": turn_ids_from_mask(loss_mask),
            "versions": torch.full_like(input_ids, -1),
            "rewards": torch.zeros(rows),
            "group_ids": torch.arange(rows),
            "no_eos": torch.zeros(rows, dtype=torch.bool),
        }
        values = {**defaults, **{k: v for k, v in fields.items() if v is not None}}
        return cls(input_ids, attention_mask.long(), loss_mask, **values)

    @classmethod
    def from_trajectories(
        cls,
        trajectories: Sequence[Trajectory],
        *,
        pad_token_id: int,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
    ) -> TrajectoryBatch:
        """Collate trajectories into one right-padded batch (module docstring for what
        each segment kind contributes). Generated segments must all carry log-probs or
        all carry none."""
        if not trajectories:
            raise ValueError("cannot build a TrajectoryBatch from no trajectories")
        rows = [row_lists(t, i) for i, t in enumerate(trajectories)]
        with_logprobs = {r["logprobs"] is not None for r in rows if r["generated"]}
        if len(with_logprobs) > 1:
            raise ValueError(
                "some generated segments carry behaviour log-probs and some do not; "
                "give all of them log-probs or none"
            )
        width = max(len(r["input_ids"]) for r in rows)
        tensors = {
            key: _padded([r[key] for r in rows], width, pad, dtype)
            for key, pad, dtype in (
                ("input_ids", pad_token_id, torch.long),
                ("attention_mask", 0, torch.long),
                ("loss_mask", 0, torch.bool),
                ("turn_ids", -1, torch.long),
                ("versions", -1, torch.long),
            )
        }
        if with_logprobs == {True}:
            tensors["logprobs"] = _padded([r["logprobs"] for r in rows], width, 0.0, torch.float32)
        routes = [t.routed_experts for t in trajectories]
        if any(r is not None for r in routes):
            tensors["routed_experts"] = _padded_routes(routes, [len(r["input_ids"]) for r in rows])
        return cls(
            **tensors,
            rewards=torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32),
            group_ids=torch.tensor([int(t.group_id) for t in trajectories], dtype=torch.long),
            no_eos=torch.tensor([bool(t.no_eos) for t in trajectories], dtype=torch.bool),
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
        )

    # ------------------------------------------------------------------ views
    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def action_mask(self) -> Tensor:
        """``(N, S)`` bool, next-token aligned: position ``t`` emits a trained token ``t+1``."""
        return action_positions(self.loss_mask)

    @property
    def behaviour_logprobs(self) -> Tensor:
        """``(N, S)`` next-token aligned behaviour log-probs (0 off trained tokens)."""
        if self.logprobs is None:
            raise ValueError("this batch carries no behaviour log-probs (TrajectoryBatch.logprobs)")
        return next_token_align(torch.where(self.loss_mask, self.logprobs, 0.0))

    def advantage_inputs(self, *, values: Tensor | None = None) -> AdvantageInputs:
        """What :func:`ardea.algo.compute_advantages` reads, next-token aligned: the action
        mask, behaviour log-probs (0 when the batch has none), rewards, row lengths, the
        pinned reference log-probs and per-token ``process_rewards``, the critic's
        ``values (N, S)`` if given, turn ids, groups."""
        mask = self.action_mask
        if self.logprobs is None:
            logprobs = torch.zeros(mask.shape, device=mask.device)
        else:
            logprobs = self.behaviour_logprobs
        return AdvantageInputs(
            mask=mask,
            logprobs=logprobs,
            rewards=self.rewards,
            lengths=self.attention_mask.sum(dim=-1),
            ref_logprobs=self.ref_logprobs,
            values=values,
            turn_ids=next_token_align(self.turn_ids, -1),
            group_ids=self.group_ids,
            no_eos=self.no_eos,
            process_rewards=self.process_rewards,
        )

    def sampling(self) -> dict[str, float | int]:
        """The distribution the behaviour log-probs describe, as keyword arguments of
        :func:`ardea.model.sequence_logprobs` (``temperature``, ``top_k``, ``top_p``)."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    def model_inputs(self) -> dict[str, Tensor | None]:
        """Keyword arguments of :func:`ardea.model.sequence_logprobs`: packed rows attend by
        position ids; rows with ``routed_experts`` replay them."""
        packed = self.position_ids is not None
        inputs = {
            "input_ids": self.input_ids,
            "attention_mask": None if packed else self.attention_mask,
            "position_ids": self.position_ids,
        }
        if self.routed_experts is not None:
            inputs["routed_experts"] = self.routed_experts
        return inputs

    # --------------------------------------------------------------- row ops
    def pin(self, **fields: Tensor) -> TrajectoryBatch:
        """A copy with pinned fields set (their shapes and dtypes checked)."""
        unknown = sorted(set(fields) - set(PINNED_FIELDS))
        if unknown:
            raise ValueError(f"cannot pin {unknown}; pinned fields are {', '.join(PINNED_FIELDS)}")
        out = self._derive(**fields)
        check_pinned(out, fields)
        return out

    def select(self, index: Tensor) -> TrajectoryBatch:
        """Rows ``index`` (a 1-D long tensor), in that order."""
        return self._derive(**_map_rows(self, lambda x: x[index.to(x.device)]))

    def to(self, device: torch.device | str) -> TrajectoryBatch:
        return self._derive(**_map_rows(self, lambda x: x.to(device)))

    def _derive(self, **changes: Tensor | None) -> TrajectoryBatch:
        """A copy with ``changes``, not validated again: rows selected, moved, trimmed or
        stacked from valid batches are valid, and checking each copy would cost device
        syncs on every micro-batch."""
        out = object.__new__(type(self))
        for f in dataclasses.fields(self):
            object.__setattr__(out, f.name, changes.get(f.name, getattr(self, f.name)))
        return out

    def trim(self) -> TrajectoryBatch:
        """Drop the columns right of every row's last real token."""
        width = int(self.attention_mask.sum(dim=-1).max()) if self.rows else 0
        if width == self.input_ids.shape[1]:
            return self
        changes = {
            name: value[:, :width]
            for name, value in _tensor_fields(self)
            if value.dim() >= 2 and value.shape[1] == self.input_ids.shape[1]
        }
        return self._derive(**changes)

    @staticmethod
    def concat(batches: Sequence[TrajectoryBatch], *, pad_token_id: int) -> TrajectoryBatch:
        """The rows of ``batches`` stacked, right-padded to the widest. The batches must have
        the same optional fields and temperature."""
        first = batches[0]
        present = [name for name, _ in _tensor_fields(first)]
        for other in batches[1:]:
            if [n for n, _ in _tensor_fields(other)] != present:
                raise ValueError("cannot concatenate batches with different fields")
            if other.sampling() != first.sampling():
                raise ValueError(
                    f"cannot concatenate batches sampled differently: {other.sampling()} "
                    f"and {first.sampling()}"
                )
        width = max(b.input_ids.shape[1] for b in batches)
        joined = {}
        for name in present:
            parts = [getattr(b, name) for b in batches]
            if parts[0].dim() >= 2:
                pad = pad_token_id if name == "input_ids" else _PAD.get(name, 0)
                parts = [_pad_columns(p, width, pad) for p in parts]
            joined[name] = torch.cat(parts)
        return first._derive(**joined)


def action_positions(trained: Tensor) -> Tensor:
    """Token-aligned ``(N, S)`` bool of trained tokens → next-token aligned: position ``t``
    is True when it emits a trained token ``t + 1`` (the model's output alignment)."""
    return next_token_align(trained.bool(), False)


def turn_ids_from_mask(loss_mask: Tensor) -> Tensor:
    """``(N, S)`` long: ``k`` on the ``k``-th run of True in each row of ``loss_mask``, -1
    elsewhere (each contiguous span of trained tokens is one assistant turn)."""
    starts = loss_mask.clone()
    starts[:, 1:] &= ~loss_mask[:, :-1]
    return torch.where(loss_mask, starts.long().cumsum(dim=-1) - 1, -1)


def _tensor_fields(batch: TrajectoryBatch) -> list[tuple[str, Tensor]]:
    return [
        (f.name, getattr(batch, f.name))
        for f in dataclasses.fields(batch)
        if isinstance(getattr(batch, f.name), Tensor)
    ]


def _map_rows(batch: TrajectoryBatch, fn) -> dict[str, Tensor]:
    return {name: fn(value) for name, value in _tensor_fields(batch)}


def _pad_columns(x: Tensor, width: int, value: float | int) -> Tensor:
    """``x (N, S, ...)`` right-padded with ``value`` to ``width`` columns."""
    if x.shape[1] == width:
        return x
    pad = x.new_full((x.shape[0], width - x.shape[1], *x.shape[2:]), value)
    return torch.cat([x, pad], dim=1)


def _padded_routes(routes: list[Tensor | None], lengths: list[int]) -> Tensor:
    """``(N, S, L, K)``: each row's ``(length, L, K)`` routes, -1 where it has none (a row
    without, the columns past its length)."""
    shapes = {tuple(r.shape[1:]) for r in routes if r is not None}
    if len(shapes) > 1:
        raise ValueError(f"trajectories carry routed experts of different shapes {sorted(shapes)}")
    first = next(r for r in routes if r is not None)
    for i, (r, n) in enumerate(zip(routes, lengths)):
        if r is not None and r.shape[0] != n:
            raise ValueError(f"trajectory {i} has {n} tokens but routed experts for {r.shape[0]}")
    rows = [first.new_full((n, *first.shape[1:]), -1) if r is None else r
            for r, n in zip(routes, lengths)]  # fmt: skip
    return pad_sequence(rows, batch_first=True, padding_value=-1)


def _padded(rows: list[list], width: int, pad, dtype: torch.dtype) -> Tensor:
    return torch.tensor([row + [pad] * (width - len(row)) for row in rows], dtype=dtype)
