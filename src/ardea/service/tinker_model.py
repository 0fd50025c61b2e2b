"""One model a Tinker training client trains: a LoRA policy, its AdamW, its saved states.

The parts are the trainer's: the base loaded by ``build_policy`` in the server's parameter
dtype, forwards under its :class:`~ardea.model.Precision` (compute dtype, attention kernel),
the AdamW of ``build_adamw`` (fused where torch has the kernel). ``forward_backward`` adds
the gradient of a request's summed loss (one of the policy losses
:mod:`ardea.service.tinker_losses` serves) to what earlier requests left; ``optim_step``
takes one AdamW step with the request's :class:`AdamParams` (learning rate, betas, eps,
decoupled weight decay, global norm clip) and clears the gradient. A datum is ``T`` input
tokens and per-token inputs of shape ``[T]``: ``target_tokens[t]`` is the token that follows
``tokens[: t + 1]``; its output ``logprobs[t] = log p(target_tokens[t] | tokens[: t + 1])``.

The LoRA layout: rank ``r`` adapters with ``alpha = 32`` (scale ``32 / r``), no dropout, on
the attention projections (``train_attn``), the MLP projections (``train_mlp``) and the LM
head (``train_unembed``) — the ones of those the architecture has. ``seed`` draws the
adapters' initial ``A`` (``B`` starts at zero, so a fresh model computes the base model).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ardea.algo import get_policy_loss, trusted_inputs
from ardea.config import ModelConfig
from ardea.model import Precision
from ardea.model.logprobs import logprobs_from_logits
from ardea.model.lora import apply_lora, load_policy_weights, save_policy
from ardea.service.tinker_fields import Fields
from ardea.service.tinker_losses import SERVED, check_datum, datum_loss, loss_options
from ardea.service.tinker_wire import ForwardBackwardCall, WireDatum, WireError
from ardea.trainer.checkpoint import STATE_FILE, load_trainer_state
from ardea.trainer.schedule import build_adamw, clip_gradients
from ardea.trainer.setup import build_policy

LORA_ALPHA = 32.0
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj", "fc1", "fc2")
UNEMBED = ("lm_head",)
MICRO_BATCH = 16  # datums per forward: bounds the [N, T, V] logits held at once
#: the trainer's AdamW (``build_adamw``: fused where torch has the kernel) at the SDK's
#: defaults; every ``optim_step`` sets its own rate, betas, eps and weight decay
ADAM = SimpleNamespace(adam_betas=(0.9, 0.95), weight_decay=0.0, lr_schedule="constant",
                       max_steps=1, min_lr_ratio=1.0)  # fmt: skip


@dataclass(frozen=True)
class LoraSpec:
    """What ``create_model``'s ``lora_config`` asks for."""

    rank: int = 32
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True
    seed: int | None = None

    def target_modules(self, model: torch.nn.Module) -> list[str]:
        wanted = (ATTN if self.train_attn else ()) + (MLP if self.train_mlp else ())
        wanted += UNEMBED if self.train_unembed else ()
        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        chosen = [m for m in wanted if m in present]
        if not chosen:
            raise WireError(f"lora_config trains no module this model has (asked: {wanted})")
        return chosen


def _tensor(datum: WireDatum, index: int, key: str, length: int, dtype) -> torch.Tensor:
    if key not in datum.inputs:
        raise WireError(f"data[{index}].loss_fn_inputs has no {key!r}")
    value = datum.inputs[key]
    if value.shape != (length,):
        raise WireError(
            f"data[{index}].loss_fn_inputs[{key!r}] has shape {list(value.shape)}, not "
            f"[{length}] (one value per input token)"
        )
    if dtype == torch.long and value.dtype.kind != "i":
        raise WireError(f"data[{index}].loss_fn_inputs[{key!r}] holds {value.dtype} values, "
                        "not integer token ids")  # fmt: skip
    tensor = torch.from_numpy(np.array(value)).to(dtype)
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise WireError(f"data[{index}].loss_fn_inputs[{key!r}] holds NaN or inf")
    return tensor


class TrainingModel:
    """A LoRA policy on ``base_dir`` with AdamW; see the module docstring."""

    def __init__(
        self, base_dir: Path, spec: LoraSpec, *, tokenizer: Any, precision: Precision | None = None,
        device: torch.device | str = "cpu",
    ) -> None:  # fmt: skip
        self.base_dir = Path(base_dir)
        self.device = torch.device(device)
        self.precision = precision or Precision(self.device, torch.float32, torch.float32)
        self.spec = spec
        self.tokenizer = tokenizer
        dtype = str(self.precision.params).removeprefix("torch.")
        base, _ = build_policy(ModelConfig(path=str(self.base_dir), dtype=dtype), seed=0,
                               device=torch.device("cpu"))  # fmt: skip
        self.targets = spec.target_modules(base)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0 if spec.seed is None else spec.seed)
            self.policy = apply_lora(
                base, r=spec.rank, alpha=LORA_ALPHA, dropout=0.0, target_modules=self.targets
            )
        self.policy.to(self.device).train()
        self.vocab = int(base.get_input_embeddings().num_embeddings)
        self.context = int(getattr(base.config, "max_position_embeddings", 2048))
        self.parameters = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer, _ = build_adamw(self.parameters, ADAM, lr=1e-4, warmup_steps=0)
        for group in self.optimizer.param_groups:
            group["eps"] = 1e-12
        self.steps = 0
        self.loss_since_step = 0.0  # summed loss of the forward_backward calls since the step

    # -- forward_backward ------------------------------------------------------------
    def checked(self, call: ForwardBackwardCall) -> list[dict[str, torch.Tensor]]:
        """The call's data as tensors, every datum checked (before the call is queued)."""
        if call.loss_fn not in SERVED:
            raise WireError(f"loss_fn {call.loss_fn!r} is not served; served: {', '.join(SERVED)}")
        needs, config_keys = SERVED[call.loss_fn]
        unknown = sorted(set(call.config) - set(config_keys))
        if unknown:
            raise WireError(f"loss_fn_config keys {unknown} mean nothing to {call.loss_fn!r}")
        for key, value in call.config.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise WireError(f"loss_fn_config[{key!r}]={value} is not finite")
        loss_options(call.loss_fn, call.config)
        if not call.data:
            raise WireError("forward_backward needs at least one datum")
        rows = []
        for i, datum in enumerate(call.data):
            length = len(datum.tokens)
            if not 0 < length <= self.context:
                raise WireError(f"data[{i}].model_input holds {length} tokens: 1 to the "
                                f"model's context of {self.context}")  # fmt: skip
            bad = [t for t in datum.tokens if not 0 <= t < self.vocab]
            if bad:
                raise WireError(f"data[{i}].model_input has token ids outside [0, {self.vocab})")
            row = {"tokens": torch.tensor(datum.tokens, dtype=torch.long)}
            row["target_tokens"] = _tensor(datum, i, "target_tokens", length, torch.long)
            if bool(((row["target_tokens"] < 0) | (row["target_tokens"] >= self.vocab)).any()):
                raise WireError(f"data[{i}].target_tokens has ids outside [0, {self.vocab})")
            for key in needs:
                row[key] = _tensor(datum, i, key, length, torch.float32)
            check_datum(call.loss_fn, row, i)
            rows.append(row)
        return rows

    def _logprobs(self, rows: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """``[N, T_max]`` log-probs of each row's targets (right-padded rows)."""
        width = max(len(r["tokens"]) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        targets = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["tokens"])
            ids[i, :n], mask[i, :n], targets[i, :n] = r["tokens"], 1, r["target_tokens"]
        ids, mask, targets = ids.to(self.device), mask.to(self.device), targets.to(self.device)
        with self.precision.forward(self.policy, width):
            logits = self.policy(input_ids=ids, attention_mask=mask).logits
        return logprobs_from_logits(logits, targets)

    def forward_backward(self, call: ForwardBackwardCall, rows: list[dict[str, torch.Tensor]]):
        """Per datum its log-probs and elementwise loss (arrays), and the metrics; the
        gradient of the summed loss is added to the parameters' (not with forward_only).
        ``rows``: :meth:`checked`'s. A failure part-way (a non-finite loss in a later
        micro-batch) puts the gradients back as they were: a failed call adds nothing."""
        before = [None if p.grad is None else p.grad.clone() for p in self.parameters]
        try:
            return self._forward_backward(call, rows)
        except BaseException:
            for p, grad in zip(self.parameters, before):
                p.grad = grad
            raise

    def _forward_backward(self, call: ForwardBackwardCall, rows: list[dict[str, torch.Tensor]]):
        served, options = get_policy_loss(call.loss_fn), loss_options(call.loss_fn, call.config)
        logprobs, losses, total = [], [], 0.0
        for start in range(0, len(rows), MICRO_BATCH):
            chunk = [{k: v.to(self.device) for k, v in r.items()}
                     for r in rows[start : start + MICRO_BATCH]]  # fmt: skip
            with torch.set_grad_enabled(not call.forward_only), trusted_inputs():
                lp = self._logprobs(chunk)
                per_row = [datum_loss(served, options, lp[i, : len(r["tokens"])], r)
                           for i, r in enumerate(chunk)]  # fmt: skip
                loss = torch.stack([x.sum() for x in per_row]).sum()
                if not math.isfinite(float(loss.detach())):
                    raise WireError(f"the loss of data[{start}:{start + len(chunk)}] is not finite")
                if not call.forward_only:
                    loss.backward()
            total += float(loss.detach())
            for i, r in enumerate(chunk):
                logprobs.append(lp[i, : len(r["tokens"])].detach().cpu().numpy())
                losses.append(per_row[i].detach().cpu().numpy())
        if not call.forward_only:
            self.loss_since_step += total
        return logprobs, losses, {"loss:sum": total}

    # -- optim_step ------------------------------------------------------------------
    def optim_step(self, params: tuple) -> dict[str, float]:
        """One AdamW step with ``params`` (:func:`adam_params` of the request); the gradient
        is then cleared."""
        lr, betas, eps, decay, clip = params
        for group in self.optimizer.param_groups:
            group.update(lr=lr, betas=betas, eps=eps, weight_decay=decay)
        grads = [p.grad for p in self.parameters if p.grad is not None]
        norm = clip_gradients(self.parameters, clip if clip > 0 else math.inf) if grads else 0.0
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            self.loss_since_step = 0.0
            raise WireError("the gradient is not finite: the step was skipped, weights unchanged")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        loss, self.loss_since_step = self.loss_since_step, 0.0
        return {"grad_norm": norm, "learning_rate": lr, "loss": loss}

    # -- weights ---------------------------------------------------------------------
    def adapter_state(self) -> dict[str, torch.Tensor]:
        """A copy of the trained tensors (the adapters), by parameter name."""
        return {n: p.detach().clone() for n, p in self.policy.named_parameters() if p.requires_grad}

    def twin(self, adapters: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
        """A frozen copy of the LoRA policy (adapters not merged) holding ``adapters``
        (default: the current ones)."""
        grads = [p.grad for p in self.parameters]
        for p in self.parameters:  # deepcopy would copy the gradients too
            p.grad = None
        try:
            twin = copy.deepcopy(self.policy)
        finally:
            for p, g in zip(self.parameters, grads):
                p.grad = g
        if adapters is not None:
            twin.load_state_dict(adapters, strict=False)
        return twin.requires_grad_(False).eval()

    def merged_copy(self, adapters: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
        """A frozen plain model: the base with ``adapters`` (default: the current) merged."""
        return self.twin(adapters).merge_and_unload().requires_grad_(False).eval()

    @property
    def layout(self) -> tuple[int, tuple[str, ...]]:
        """What shapes its adapters: the rank and the adapted modules."""
        return self.spec.rank, tuple(sorted(self.targets))

    def save_state(self, directory: Path, *, optimizer: bool = True) -> None:
        """Write ``policy/`` (merged), ``adapter/`` and ``trainer_state.pt`` (AdamW state and
        step count) into ``directory`` (the store makes it atomic and seals it)."""
        state: dict[str, Any] = {"steps": self.steps}
        if optimizer:
            state["optimizer"] = self.optimizer.state_dict()
        save_policy(self.policy, self.tokenizer, Path(directory))
        torch.save(state, Path(directory) / STATE_FILE)

    def load_state(self, directory: Path, *, optimizer: bool) -> None:
        """Load a state written by :meth:`save_state` (the optimizer's too when asked)."""
        load_policy_weights(self.policy, directory)
        state = load_trainer_state(directory)
        self.steps = int(state.get("steps", 0))
        if optimizer:
            if "optimizer" not in state:
                raise WireError(f"{directory} was saved without its optimizer state")
            self.optimizer.load_state_dict(state["optimizer"])
        self.optimizer.zero_grad(set_to_none=True)


def adam_params(adam: dict[str, Any]) -> tuple[float, tuple[float, float], float, float, float]:
    """``(lr, betas, eps, weight_decay, grad_clip_norm)`` of the SDK's ``AdamParams``, each
    finite and in a range that can train (``eps > 0``: it bounds Adam's step)."""
    fields = Fields(adam, "optim_step.adam_params")
    # Adam moves each weight by up to about lr a step: past 1 a step outweighs the weights
    lr = fields.number("learning_rate", 1e-4, low=0.0, high=1.0)
    betas = (fields.number("beta1", 0.9, low=0.0, high=1.0 - 1e-12),
             fields.number("beta2", 0.95, low=0.0, high=1.0 - 1e-12))  # fmt: skip
    eps = fields.number("eps", 1e-12, low=0.0, above=True)
    # decoupled decay multiplies each weight by 1 - lr * weight_decay: past 1 it flips signs
    decay = fields.number("weight_decay", 0.0, low=0.0, high=1.0 / lr if lr > 0 else math.inf)
    clip = fields.number("grad_clip_norm", 0.0, low=0.0)
    return lr, betas, eps, decay, clip
