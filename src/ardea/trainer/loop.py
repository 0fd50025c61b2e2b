"""The training loop: one place that owns evaluation, logging, checkpoints and resume, for
every strategy.

A step is one of two kinds, each read top to bottom: an offline step ``data`` (the step's
samples collated into ``trainer.grad_accum_steps`` micro-batches) → the updates
(:class:`~ardea.trainer.step.updates.Updater`: ``forward_backward``, ``optimizer``); an online
step is the RL step of :mod:`ardea.trainer.step.rl_step` (generate → score → filter →
advantages → updates → weight_sync). Each phase is timed under its own name
(``perf/time_<phase>``). Then ``log``; evaluation and checkpoints follow on their cadence.
An update whose loss or gradient is NaN/Inf is skipped and counted; too many in a row stop
the run with the last good state saved. A run ends at ``trainer.max_steps``, when
``trainer.max_train_seconds`` of training time are spent, or at the evaluation where the
early stop (:mod:`ardea.trainer.early_stop`) says it has learned.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import Any

import torch

from ardea.agent.runs import AgentEvaluation, agent_rows, episode_runner, make_runner
from ardea.config import ArdeaConfig
from ardea.data import make_task
from ardea.data.sampler import EpochSampler
from ardea.errors import ArdeaError
from ardea.model.flops import COUNTER
from ardea.model.lora import is_lora
from ardea.rollout import (
    EngineSpec,
    GenerationEngine,
    make_engine,
    own_copy,
    per_process_engine,
)
from ardea.rollout.service import RolloutService
from ardea.trainer.data_source import eval_samples, max_sequence_length, training_samples
from ardea.trainer.distributed import Distributed, unwrap
from ardea.trainer.early_stop import EarlyStop
from ardea.trainer.evaluate import Evaluator, append_samples
from ardea.trainer.frozen_heap import frozen_heap
from ardea.trainer.host_memory import keep_freed_memory
from ardea.trainer.metrics_log import MetricsLogger, open_logs
from ardea.trainer.node_disks import agreed_checkpoint, checkpoint_writers
from ardea.trainer.profile import StepProfile
from ardea.trainer.progress import TrainingProgress
from ardea.trainer.report import draw_report
from ardea.trainer.results import finish_run
from ardea.trainer.run_checkpoint import restore_run, save_run
from ardea.trainer.run_dirs import prepare_run_directory, run_directory
from ardea.trainer.setup import (
    build_trainable_policy,
    check_distributed,
    context_length,
    probe_shapes,
    resolve_device,
    resolve_precision,
    seed_everything,
)
from ardea.trainer.state_dicts import full_state_dict, local_state_dict
from ardea.trainer.step.offline_step import OfflineStep
from ardea.trainer.step.rl_step import RLStep
from ardea.trainer.step.updates import Updater
from ardea.trainer.strategies import OnlineStrategy, make_strategy, strategy_class
from ardea.trainer.trajectory_html import write_trajectories_html
from ardea.trainer.trajectory_samples import append_token_rows
from ardea.trainer.watch import judge


class Trainer:
    """Runs ``config`` end to end: ``Trainer(config).train()`` returns the results dict."""

    def __init__(self, config: ArdeaConfig) -> None:
        self.config = config
        trainer = config.trainer
        if trainer.num_threads:
            torch.set_num_threads(trainer.num_threads)
        keep_freed_memory(trainer.host_memory)
        device = resolve_device(trainer.device)
        self.dist = Distributed(trainer.distributed, device, trainer.dist_timeout_s)
        self.device = self.dist.device  # cuda:LOCAL_RANK under torchrun
        check_distributed(config, self.dist)
        seed_everything(config.trainer.seed)
        data = config.data
        self.task = make_task(data.task, seed=data.seed, **data.task_args) if data.task else None
        policy, self.tokenizer = build_trainable_policy(config, self.device)
        self.mode_choice = self.dist.settle(policy)  # trainer.distributed=auto, decided
        self.run_dir = run_directory(config)
        # the same step on every rank, each from its own disk (ardea.trainer.node_disks)
        self.resume_from = agreed_checkpoint(self.dist, self.run_dir, trainer.resume)
        strategy_cls = strategy_class(config.algo.name)
        self.strategy_head = strategy_cls.model_head
        max_length = max_sequence_length(config, context_length(policy))
        kind = strategy_cls.sample_kind  # what the data loader reads
        self.train_samples = training_samples(
            config, self.tokenizer, kind, self.task, max_length=max_length
        )
        held_out = eval_samples(config, self.tokenizer, kind, self.task, max_length=max_length)
        prepare = functools.partial(prepare_run_directory, config)  # the inputs are good
        self.dist.writers = checkpoint_writers(self.dist, self.run_dir, prepare)  # node disks
        shapes = probe_shapes(config, policy, max_length, self.dist.world_size)
        self.precision = resolve_precision(config, policy, shapes, self.dist)
        engine = self._build_engine(policy)  # on every rank
        self.policy = self._wrap(policy, trainable=True)
        self.strategy = make_strategy(
            config.algo.name,
            self.policy,
            config,
            tokenizer=self.tokenizer,
            make_reference=self._make_reference,
            wrap=self._wrap,
            device=self.device,
            rows=self.dist.rows,
        )
        self.updater = Updater(self.policy, self.strategy, config, self.precision, self.dist)
        self.sampler = EpochSampler(
            len(self.train_samples), config.trainer.batch_size, seed=config.trainer.seed
        )
        self._build_rollouts(
            engine, online=issubclass(strategy_cls, OnlineStrategy), held_out=held_out
        )
        self.step = 0
        self.train_seconds = 0.0  # wall time spent in training steps (trainer.max_train_seconds)
        self.history: dict[str, list[list[float]]] = {}
        self.best: dict[str, Any] | None = None  # step and metric of checkpoints/best/
        self.profile = StepProfile(shapes)  # this invocation's steps (like its wall time)
        self.early_stop = EarlyStop.of(trainer)
        self.stopped: str | None = None  # why the early stop ended the run
        if self.resume_from is not None:
            restore_run(self, self.resume_from)
            if self.early_stop is not None and self.history:  # a run that stopped stays so
                self.stopped = self.early_stop.verdict(self.history)

    def _build_rollouts(self, engine: GenerationEngine | None, *, online: bool, held_out) -> None:
        """The rollout service on ``engine`` (online runs: rollouts from the live policy,
        through the RL step) and the evaluator, each on this rank's engine."""
        config = self.config
        self.service = RolloutService(
            config,
            dist=self.dist,
            engine=engine,
            runner=make_runner(config, engine, self.tokenizer, self.task)
            if online and engine is not None
            else None,
            samples=self.train_samples,
            sampler=self.sampler,
            gather_weights=self._gather_weights,
            make_worker_engine=self._make_worker_engine,
        )
        self.recipe = self._online_step() if online else self._offline_step()
        self.evaluator = Evaluator(
            config, self.task, engine, self.tokenizer, self.strategy, held_out, self.precision
        )
        eval_rows = agent_rows(config, "eval") if config.agent.plays_episodes else []
        if eval_rows and engine is not None:
            runner = episode_runner(config, engine, self.tokenizer, evaluation=True)
            self.evaluator.agent = AgentEvaluation(runner, eval_rows)

    def _build_engine(self, policy: torch.nn.Module) -> GenerationEngine | None:
        """The live policy's engine (``rollout.engine``), on every rank: each generates its
        share of every rollout. An engine in the process decodes on its own plain copy
        under torchrun; on an engine whose servers the ranks share (vLLM) rank 0 leads and
        holds the copy its weights load into, the others follow (``spec.peers``). The
        trainer keeps the module it gave the engine, to copy for a background worker's
        engine (and a LoRA checkpoint under FSDP2, to merge). None when nothing generates."""
        config = self.config
        merges = self.dist.mode == "fsdp2" and is_lora(policy)  # a checkpoint merges a copy
        copies = merges and self.dist.rank in self.dist.writers
        self.engine_per_process = per_process_engine(config.rollout.engine)
        self.engine_leads = self.engine_per_process or self.dist.is_main
        if self.strategy_head != "causal_lm":  # a reward model's run generates nothing
            self.engine_module = own_copy(policy) if copies else None
            return None
        section = getattr(config.rollout, config.rollout.engine, None)  # rollout.<engine>
        self.engine_spec = EngineSpec.of(
            policy,
            self.tokenizer,
            model_dir=config.model.path,
            precision=self.precision,
            options=dataclasses.asdict(section) if dataclasses.is_dataclass(section) else {},
            work_dir=self.run_dir / "engine",
            peers=None if self.engine_per_process else self.dist.engine_peers("live"),
        )
        copies |= self.dist.active and self.engine_leads
        self.engine_module = own_copy(policy) if copies else policy  # a follower reads it once
        return make_engine(config.rollout.engine, self.engine_spec, module=self.engine_module)

    def _make_worker_engine(self, version: int) -> GenerationEngine:
        """An engine on its own copy of the live engine's weights (at ``version``), for the
        background worker (a follower's on rank 0's worker servers)."""
        peers = None if self.engine_per_process else self.dist.engine_peers("worker")
        work_dir = str(self.run_dir / "worker_engine")
        spec = dataclasses.replace(self.engine_spec, work_dir=work_dir, peers=peers)
        module = own_copy(self.engine_module) if self.engine_leads else self.engine_module
        return make_engine(self.config.rollout.engine, spec, module=module, version=version)

    def _wrap(self, module: torch.nn.Module, *, trainable: bool) -> torch.nn.Module:
        """``module`` wrapped for ``trainer.distributed`` (DDP / FSDP2; as it is for none)."""
        return self.dist.wrap(module, trainable=trainable, compute_dtype=self.precision.compute)

    def _gather_weights(self) -> dict[str, torch.Tensor]:
        """The policy's weights by name, for the engines (every rank calls it): an engine in
        the process gets this rank's own tensors — a whole replica in one process and
        under DDP (nothing to gather), FSDP2 shards under FSDP2, which the engine gathers
        whole on the device one tensor at a time (never a second whole copy on a host).
        On servers the ranks share, rank 0 loads them: it gets the whole weights (under
        FSDP2 gathered onto its CPU), the others {}. A LoRA policy gives its adapters
        alone: engines keep the frozen base they started with."""
        lora = is_lora(unwrap(self.policy))
        if self.engine_per_process:
            return local_state_dict(self.policy, trained_only=lora)
        if self.dist.mode == "fsdp2":
            return full_state_dict(self.policy, cpu=True, trained_only=lora)
        return full_state_dict(self.policy, trained_only=lora) if self.dist.is_main else {}

    @property
    def nonfinite(self) -> dict[str, int]:
        return self.updater.nonfinite

    def _offline_step(self) -> OfflineStep:
        return OfflineStep(
            self.config,
            strategy=self.strategy,
            service=self.service,
            updater=self.updater,
            samples=self.train_samples,
            sampler=self.sampler,
            dist=self.dist,
            device=self.device,
        )

    def _online_step(self) -> RLStep:
        return RLStep(
            self.config,
            policy=self.policy,
            strategy=self.strategy,
            service=self.service,
            tokenizer=self.tokenizer,
            updater=self.updater,
            samples=self.train_samples,
            sampler=self.sampler,
            dist=self.dist,
        )

    def _make_reference(self) -> torch.nn.Module:
        """A fresh, unwrapped copy of the policy the run started from (rebuilt from its
        source, without adapters)."""
        reference, _ = build_trainable_policy(self.config, self.device, lora=False)
        return reference

    # ------------------------------------------------------------ checkpoints
    def save(self, *, best: bool = False) -> Path:
        """Write a checkpoint (:func:`~ardea.trainer.run_checkpoint.save_run`); ``best``:
        into ``checkpoints/best/`` (``trainer.keep_best``), replacing the one there."""
        return save_run(self, best=best)

    # ------------------------------------------------------------------ a step
    def train_step(self) -> dict[str, float]:
        """One training step (one or more optimizer updates); returns its metrics."""
        self.policy.train()
        return self.recipe.run(self.step)

    # ------------------------------------------------------------------- loop
    def _done(self) -> bool:
        """max_steps reached, the trainer.max_train_seconds budget spent, or stopped early."""
        budget = self.config.trainer.max_train_seconds
        over = self.step >= self.config.trainer.max_steps or 0 < budget <= self.train_seconds
        return over or self.stopped is not None

    def _due(self, every: int) -> bool:
        return every > 0 and self.step % every == 0 and not self._done()

    def _evaluate(self, logger: MetricsLogger | None, progress: TrainingProgress) -> None:
        self.recipe.before_evaluation(self.step)
        # each rank generates its share (rank 0 writes); every rank computes a held-out
        # loss (it runs the sharded policy)
        run_dir = self.run_dir if self.dist.is_main else None
        metrics = self.evaluator.generated(self.step, run_dir, self.service.shares)
        metrics |= self.evaluator.losses()
        if not metrics:
            return
        if logger is not None:
            logger.log(self.step, metrics)
        for key, value in metrics.items():
            self.history.setdefault(key, []).append([self.step, value])
        progress.print(
            f"step {self.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        )
        if self.early_stop is not None:  # rank 0's verdict, for every rank
            self.stopped = self.dist.broadcast(self.early_stop.verdict(self.history))
            if self.stopped is not None:
                progress.print(f"early stop at step {self.step}: {self.stopped}")
        verdict = judge(self.history, self.step)
        if verdict is None:
            return
        name, warning, improved = verdict
        if warning:
            progress.print(warning)
        # rank 0's decision: every rank takes part in writing a checkpoint
        if self.config.trainer.keep_best and self.dist.broadcast(improved):
            self.best = {"step": self.step, "metric": name}
            self.save(best=True)

    def _check_nonfinite(self) -> None:
        limit = self.config.trainer.max_nonfinite_steps
        if self.nonfinite["consecutive"] >= limit:
            saved = self.save()
            raise ArdeaError(
                f"training stopped at step {self.step}: {limit} consecutive steps had a "
                f"non-finite loss or gradient (each was skipped); the last good weights are "
                f"saved in {saved}. Lower trainer.lr or check the data."
            )

    def _loop(self, logger: MetricsLogger | None, progress: TrainingProgress) -> None:
        cfg = self.config
        while not self._done():
            started, flops = time.perf_counter(), COUNTER.totals()
            metrics = self.train_step()
            seconds = time.perf_counter() - started
            self.train_seconds += seconds
            self.profile.add(metrics, seconds, COUNTER.since(flops))
            self.step += 1
            if logger is not None and (self.step % cfg.logging.log_every == 0 or self._done()):
                logger.log(self.step, metrics)
                if self.recipe.last_samples:
                    append_samples(self.run_dir, self.step, self.recipe.last_samples)
                append_token_rows(self.run_dir, self.step, self.recipe.last_rows)
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
        """Run to the end; rank 0 logs, writes the report and ``results.json`` and returns
        the results (the other ranks return only ``checkpoint``, the final policy)."""
        cfg = self.config
        start = time.time()
        logger = (
            open_logs(self.run_dir, self.config, self.step if self.resume_from else None)
            if self.dist.is_main
            else None
        )
        try:
            with TrainingProgress(
                cfg.trainer.max_steps,
                start=self.step,
                enabled=cfg.logging.progress and self.dist.is_main,
                quiet=not self.dist.is_main,
            ) as progress:
                if self.mode_choice is not None:
                    progress.print(self.mode_choice)
                if self.resume_from is not None:
                    progress.print(f"resumed from {self.resume_from} at step {self.step}")
                else:
                    self._evaluate(logger, progress)
                finished = self.resume_from is not None and self._done()  # from the final one
                with frozen_heap():
                    self._loop(logger, progress)
                if not finished and self.stopped is None:  # a stop follows an evaluation
                    self._evaluate(logger, progress)
            checkpoint = self.resume_from if finished else self.save()
        except Exception as error:
            failure = self.dist.failure(error)  # a rank died or hangs: name it
            if failure is None:
                raise
            raise failure from error
        finally:
            if self.evaluator.agent is not None:
                self.evaluator.agent.runner.close()
            self.service.close()
            self.strategy.close()
            self.strategy.scorers.close()
            self.dist.close()
            if logger is not None:
                logger.close()
        if not self.dist.is_main:  # what a next stage needs: where the final policy is
            return {"checkpoint": str(Path(checkpoint) / "policy") if checkpoint else None}
        if self.config.logging.report:
            draw_report(self.run_dir)
            write_trajectories_html(self.run_dir)
        return finish_run(self, checkpoint=checkpoint, wall_seconds=time.time() - start)
