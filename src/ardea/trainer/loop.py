"""The training loop: one place that owns optimizer, accumulation, clipping, schedule,
evaluation, logging, checkpoints and resume, for every strategy.

A step reads top to bottom: ``data`` (the step's samples, turned by the strategy into one
or more optimizer updates: for offline strategies one update of collated micro-batches,
for online strategies a rollout with its advantages and ``algo.ppo_epochs`` ×
``algo.ppo_mini_batches`` updates) → per update ``forward_backward`` (per micro-batch, loss
normalised by the update's counts) and ``optimizer`` (clip, step, strategy hook) → the
schedule advances once → the strategy's end-of-step hook (online: publish the new policy
version) → ``log``; evaluation and checkpoints follow on their cadence. Each phase is timed
under its own name (``perf/time_<phase>``). An update whose loss or gradient is NaN/Inf is
skipped and counted; too many in a row stop the run with the last good state saved. A run
ends at ``trainer.max_steps`` or when ``trainer.max_train_seconds`` of training time are
spent.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ardea.config import ArdeaConfig, config_to_yaml
from ardea.data import make_task
from ardea.data.sampler import EpochSampler
from ardea.errors import ArdeaError
from ardea.model.lora import load_policy_weights
from ardea.reward import build_scorer
from ardea.rollout import InProcessEngine, RolloutRunner, SamplingParams
from ardea.trainer.checkpoint import load_trainer_state, save_checkpoint
from ardea.trainer.data_source import eval_samples, max_sequence_length, training_samples
from ardea.trainer.evaluate import Evaluator, append_samples
from ardea.trainer.metrics_log import MetricsLogger, truncate_metrics
from ardea.trainer.progress import TrainingProgress
from ardea.trainer.report import draw_report
from ardea.trainer.results import finish_run
from ardea.trainer.schedule import build_adamw
from ardea.trainer.setup import (
    build_trainable_policy,
    context_length,
    make_engine,
    prepare_run_directory,
    resolve_device,
    resume_checkpoint,
    run_directory,
    seed_everything,
)
from ardea.trainer.state import restore_rng_state, rng_state
from ardea.trainer.strategies import strategy_class


@dataclass
class PhaseTimer:
    """Wall-clock seconds per named phase within one step."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"perf/time_{name}": value for name, value in self.seconds.items()}


class Trainer:
    """Runs ``config`` end to end: ``Trainer(config).train()`` returns the results dict."""

    def __init__(self, config: ArdeaConfig) -> None:
        self.config = config
        if config.trainer.num_threads:
            torch.set_num_threads(config.trainer.num_threads)
        self.device = resolve_device(config.trainer.device)
        seed_everything(config.trainer.seed)
        data = config.data
        self.task = make_task(data.task, seed=data.seed, **data.task_args) if data.task else None
        self.policy, self.tokenizer = build_trainable_policy(config, self.device)
        self.run_dir = run_directory(config)
        self.resume_from = resume_checkpoint(self.run_dir, config.trainer.resume)
        strategy_cls = strategy_class(config.algo.name)
        max_length = max_sequence_length(config, context_length(self.policy))
        kind = strategy_cls.sample_kind
        self.train_samples = training_samples(
            config, self.tokenizer, kind, self.task, max_length=max_length
        )
        held_out = eval_samples(config, self.tokenizer, kind, max_length=max_length)
        prepare_run_directory(config)  # only once the inputs are known to be good
        engine = make_engine(self.policy, self.tokenizer)
        runner = self._build_runner(engine) if kind == "prompt" else None
        self.strategy = strategy_cls(
            self.policy,
            config,
            tokenizer=self.tokenizer,
            make_reference=self._make_reference,
            runner=runner,
        )
        for module in self.strategy.frozen_modules():
            module.to(self.device)
        self.strategy.bind_data(self.train_samples)
        self._build_optimizer()
        self.sampler = EpochSampler(
            len(self.train_samples), config.trainer.batch_size, seed=config.trainer.seed
        )
        self.evaluator = Evaluator(
            config, self.task, engine, self.tokenizer, self.strategy, held_out
        )
        self.step = 0
        self.train_seconds = 0.0  # wall time spent in training steps (trainer.max_train_seconds)
        self.history: dict[str, list[list[float]]] = {}
        self.nonfinite = {"consecutive": 0, "total": 0}
        if self.resume_from is not None:
            self._restore(self.resume_from)

    def _build_runner(self, engine: InProcessEngine) -> RolloutRunner:
        rollout = self.config.rollout
        params = SamplingParams(
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            max_new_tokens=rollout.max_new_tokens,
            min_new_tokens=rollout.min_new_tokens,
        )
        reward = self.config.reward
        # rollout/accuracy by the task's verifier only where the prompts are the task's own
        accuracy_task = None if self.config.data.path else self.task
        return RolloutRunner(
            engine,
            self.tokenizer,
            build_scorer(reward, self.task),
            group_size=rollout.group_size,
            params=params,
            chat_template=self.config.data.chat_template,
            seed=self.config.trainer.seed,
            task=accuracy_task,
            overlong_buffer=reward.overlong_buffer,
            overlong_penalty=reward.overlong_penalty,
        )

    def _make_reference(self) -> torch.nn.Module:
        """A frozen copy of the policy the run started from (rebuilt from its source)."""
        reference, _ = build_trainable_policy(self.config, self.device, lora=False)
        reference.requires_grad_(False)
        return reference.eval()

    def _build_optimizer(self) -> None:
        trainer = self.config.trainer
        self.parameters = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = build_adamw(
            self.parameters, trainer, lr=trainer.lr, warmup_steps=trainer.warmup_steps
        )

    # ------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        state = {
            "step": self.step,
            "train_seconds": self.train_seconds,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(),
            "history": self.history,
            "nonfinite": dict(self.nonfinite),
            "strategy": self.strategy.state_dict(),
            "config_yaml": config_to_yaml(self.config),
        }
        return save_checkpoint(
            self.run_dir,
            self.step,
            policy=self.policy,
            tokenizer=self.tokenizer,
            state=state,
            keep_last=self.config.trainer.keep_last,
            save_extra=self.strategy.save_modules,
        )

    def _restore(self, checkpoint: Path) -> None:
        state = load_trainer_state(checkpoint)
        load_policy_weights(self.policy, checkpoint)
        self.strategy.load_modules(checkpoint)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.history = state["history"]
        self.nonfinite = dict(state["nonfinite"])
        self.strategy.load_state_dict(state["strategy"])
        restore_rng_state(state["rng"])

    # ----------------------------------------------------------------- phases
    def _plan(self) -> list[list[dict[str, torch.Tensor]]]:
        """This step's samples (and the next ``strategy.lookahead`` steps' ones, which stay
        in the sampler), turned into optimizer updates by the strategy."""
        samples = [self.train_samples[i] for i in self.sampler.next_batch()]
        ahead = min(self.strategy.lookahead, self.config.trainer.max_steps - self.step - 1)
        upcoming = [[self.train_samples[i] for i in batch] for batch in self.sampler.peek(ahead)]
        return self.strategy.plan_step(
            samples,
            step=self.step,
            micro_batches=self.config.trainer.grad_accum_steps,
            upcoming=upcoming,
        )

    def _forward_backward(self, micro_batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        counts = self.strategy.step_counts(micro_batches)
        totals: dict[str, float] = {}
        for batch in micro_batches:
            loss, metrics = self.strategy.loss(batch, counts)
            loss.backward()
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + value
        return totals

    def _optimizer_step(self, loss: float) -> tuple[dict[str, float], bool]:
        """Clip and step, or skip a non-finite step; returns its metrics and whether it
        was applied."""
        max_norm = self.config.trainer.max_grad_norm or float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, max_norm))
        metrics = {"train/grad_norm": grad_norm, "train/lr": self.scheduler.get_last_lr()[0]}
        applied = math.isfinite(loss) and math.isfinite(grad_norm)
        if not applied:
            self.optimizer.zero_grad(set_to_none=True)  # skip: weights stay the last good ones
            self.strategy.skip_optimizer_step()
            self.nonfinite["consecutive"] += 1
            self.nonfinite["total"] += 1
        else:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.strategy.after_optimizer_step()
            self.nonfinite["consecutive"] = 0
        return metrics, applied

    def train_step(self) -> dict[str, float]:
        """One training step (one or more optimizer updates); returns its metrics."""
        timer = PhaseTimer()
        self.policy.train()
        with timer.phase("data"):
            updates = self._plan()
        per_update, applied = [], False
        for micro_batches in updates:
            with timer.phase("forward_backward"):
                metrics = self._forward_backward(micro_batches)
            with timer.phase("optimizer"):
                step_metrics, ok = self._optimizer_step(metrics.get("train/loss", 0.0))
            per_update.append(metrics | step_metrics)
            applied |= ok
        if applied:
            self.scheduler.step()
        self.strategy.after_train_step()
        metrics = _mean_metrics(per_update)
        metrics["train/nonfinite_steps"] = float(self.nonfinite["total"])
        metrics.update(self.strategy.step_metrics())
        tokens = sum(_token_count(b) for update in updates for b in update)
        metrics.update(timer.metrics())
        metrics["perf/tokens_per_s"] = tokens / max(sum(timer.seconds.values()), 1e-9)
        train_seconds = timer.seconds.get("forward_backward", 0.0) + timer.seconds.get(
            "optimizer", 0.0
        )
        metrics["perf/train_tokens_per_s"] = tokens / max(train_seconds, 1e-9)
        return metrics

    # ------------------------------------------------------------------- loop
    def _done(self) -> bool:
        """max_steps reached, or the trainer.max_train_seconds budget spent."""
        budget = self.config.trainer.max_train_seconds
        return self.step >= self.config.trainer.max_steps or 0 < budget <= self.train_seconds

    def _due(self, every: int) -> bool:
        return every > 0 and self.step % every == 0 and not self._done()

    def _evaluate(self, logger: MetricsLogger, progress: TrainingProgress) -> None:
        metrics = self.evaluator.run(self.step, self.run_dir)
        if not metrics:
            return
        logger.log(self.step, metrics)
        for name, value in metrics.items():
            self.history.setdefault(name, []).append([self.step, value])
        progress.print(
            f"step {self.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        )

    def _check_nonfinite(self) -> None:
        limit = self.config.trainer.max_nonfinite_steps
        if self.nonfinite["consecutive"] >= limit:
            saved = self.save()
            raise ArdeaError(
                f"training stopped at step {self.step}: {limit} consecutive steps had a "
                f"non-finite loss or gradient (each was skipped); the last good weights are "
                f"saved in {saved}. Lower trainer.lr or check the data."
            )

    def _loop(self, logger: MetricsLogger, progress: TrainingProgress) -> None:
        cfg = self.config
        while not self._done():
            started = time.perf_counter()
            metrics = self.train_step()
            self.train_seconds += time.perf_counter() - started
            self.step += 1
            samples = self.strategy.step_samples()
            if self.step % cfg.logging.log_every == 0 or self._done():
                logger.log(self.step, metrics)
                if samples:
                    append_samples(self.run_dir, self.step, samples)
            self._check_nonfinite()
            progress.update(
                self.step,
                loss=metrics.get("train/loss", float("nan")),
                tokens_per_s=metrics["perf/tokens_per_s"],
            )
            if self._due(cfg.trainer.eval_every):
                self._evaluate(logger, progress)
            if self._due(cfg.trainer.save_every):
                self.save()

    def train(self) -> dict[str, Any]:
        cfg = self.config
        start = time.time()
        logger = MetricsLogger(
            self.run_dir,
            tensorboard=cfg.logging.tensorboard,
            wandb=self._wandb_settings(),
            resume_step=self.step if self.resume_from else None,
        )
        samples = self.run_dir / "samples.jsonl"
        if self.resume_from is not None:  # drop what the killed run wrote after its checkpoint
            truncate_metrics(samples, self.step)
        elif samples.exists():
            samples.unlink()
        try:
            with TrainingProgress(
                cfg.trainer.max_steps, start=self.step, enabled=cfg.logging.progress
            ) as progress:
                if self.resume_from is not None:
                    progress.print(f"resumed from {self.resume_from} at step {self.step}")
                else:
                    self._evaluate(logger, progress)
                finished = self._done()  # resumed from the final checkpoint
                self._loop(logger, progress)
                if not finished:
                    self._evaluate(logger, progress)
            checkpoint = self.resume_from if finished else self.save()
        finally:
            self.strategy.close()
            logger.close()
        draw_report(self.run_dir)
        return finish_run(self, checkpoint=checkpoint, wall_seconds=time.time() - start)

    def _wandb_settings(self) -> dict[str, Any] | None:
        log = self.config.logging
        if not log.wandb:
            return None
        from omegaconf import OmegaConf

        return {
            "project": log.wandb_project,
            "mode": log.wandb_mode,
            "name": self.config.trainer.run_name,
            "config": OmegaConf.to_container(OmegaConf.structured(self.config)),
        }


def _mean_metrics(per_update: list[dict[str, float]]) -> dict[str, float]:
    """Each metric averaged over the optimizer updates of a step that report it."""
    names = dict.fromkeys(name for metrics in per_update for name in metrics)
    out = {}
    for name in names:
        values = [m[name] for m in per_update if name in m]
        out[name] = sum(values) / len(values)
    return out


def _token_count(batch: dict[str, torch.Tensor]) -> int:
    """Non-padding tokens in a micro-batch, whatever its layout."""
    masks = [v for k, v in batch.items() if k.endswith("attention_mask")]
    if masks:
        return int(sum(m.sum() for m in masks))
    return int(batch["input_ids"].numel())
