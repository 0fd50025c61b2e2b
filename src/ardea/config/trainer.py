"""The ``trainer`` section: the optimizer and its schedule, evaluation and checkpoint
cadence, resume, when a run stops (``max_steps``, a training-time budget, the early stop)
and the process set-up (device, threads, torchrun)."""

from __future__ import annotations

from dataclasses import dataclass

from ardea.config.fields import check_choices, check_range, option
from ardea.errors import ConfigError

LR_SCHEDULES = ("constant", "cosine", "linear")
DISTRIBUTED = ("auto", "none", "ddp", "fsdp2")
HOST_MEMORY = ("auto", "keep", "release")
EARLY_STOP_MODES = ("max", "min")


@dataclass
class TrainerConfig:
    run_name: str = option("default", "Name of the run; the run directory is runs/<run_name>.")
    output_dir: str | None = option(None, "Run directory; null means runs/<run_name>.")
    max_steps: int = option(2500, "Optimizer steps to run.")
    batch_size: int = option(64, "Sequences per optimizer step (summed over accumulation).")
    grad_accum_steps: int = option(1, "Micro-batches per optimizer step.")
    lr: float = option(3e-3, "Peak learning rate (AdamW).")
    weight_decay: float = option(0.01, "AdamW weight decay.")
    adam_betas: list[float] = option(help="AdamW betas.", factory=lambda: [0.9, 0.98])
    lr_schedule: str = option(
        "cosine", "Learning-rate schedule: constant, cosine or linear.", choices=LR_SCHEDULES
    )
    warmup_steps: int = option(100, "Linear warm-up steps from 0 to the peak learning rate.")
    min_lr_ratio: float = option(0.1, "Final learning rate as a fraction of the peak.")
    max_grad_norm: float = option(1.0, "Clip the global gradient norm to this (0 = off).")
    eval_every: int = option(500, "Evaluate every N steps (0 = only at the end).")
    eval_samples: int = option(
        0,
        "Sampled completions per held-out task prompt at each evaluation, at "
        "rollout.temperature / top_p / top_k: eval/avg@n, eval/pass@k and eval/maj@k beside "
        "the greedy eval/accuracy (0 = greedy only).",
    )
    eval_k: int = option(
        0, "k of eval/pass@k and eval/maj@k, at most trainer.eval_samples (0 = eval_samples)."
    )
    save_every: int = option(1000, "Save a checkpoint every N steps (0 = only at the end).")
    keep_last: int = option(2, "Checkpoints kept on disk (older ones are deleted).")
    keep_best: bool = option(
        False,
        "Also keep the checkpoint of the best evaluation so far in checkpoints/best/ "
        "(by eval/accuracy, else eval/success_rate, else eval/reward_mean); results.json "
        "names it (best_checkpoint, best_step) beside the last one (checkpoint).",
    )
    seed: int = option(0, "Seed for model init, data order and sampling.")
    device: str = option("auto", "cpu, cuda, cuda:N or auto (cuda when available).")
    num_threads: int = option(0, "CPU threads for torch (0 = torch's default).")
    host_memory: str = option(
        "auto",
        "What the process does with freed host memory: keep (raise glibc's mmap and trim "
        "thresholds so a step reuses the memory the last one freed instead of faulting fresh "
        "pages in; resident memory stays at its peak), release (the C library's default) or "
        "auto (keep where the C library is glibc).",
        choices=HOST_MEMORY,
    )
    resume: str = option(
        "never",
        "never (start afresh: a runs/<run_name> that holds a run gives way to "
        "runs/<run_name>-2, ...; a named output_dir that holds one is an error), auto "
        "(continue the run there from its last complete checkpoint, if its config is this "
        "one but for step counts, cadences, the early stop, threads, devices and logging; "
        "or start fresh) or a checkpoint directory (its state, in a directory as for never).",
    )
    max_nonfinite_steps: int = option(
        5,
        "Stop after this many consecutive steps with a NaN/Inf loss or gradient (each is skipped).",
    )
    max_train_seconds: float = option(
        0.0,
        "Also stop once training steps have taken this many seconds (evaluations and "
        "checkpoints not counted), then evaluate and save as at max_steps; 0 = no limit.",
    )
    early_stop_target: float | None = option(
        None,
        "Stop the run (or stage) at the first evaluation where trainer.early_stop_metric "
        "reaches this value (>= in mode max, <= in min), then save as at max_steps; null = "
        "no target.",
    )
    early_stop_patience: int = option(
        0,
        "Stop after this many evaluations in a row without a gain of more than "
        "trainer.early_stop_min_delta over the best before them; 0 = no patience stop.",
    )
    early_stop_metric: str = option(
        "auto",
        "The held-out metric the early stop watches: an eval/ metric name, or auto (what "
        "keep_best watches: eval/accuracy, else eval/success_rate, else eval/reward_mean).",
    )
    early_stop_mode: str = option(
        "max",
        "Whether higher (max) or lower (min) values of the metric are better.",
        choices=EARLY_STOP_MODES,
    )
    early_stop_min_delta: float = option(
        0.0, "The smallest change of the metric that counts as a gain for the patience."
    )
    distributed: str = option(
        "auto",
        "Data parallelism under torchrun: fsdp2 (policy, critic and frozen copies sharded "
        "with fully_shard), ddp (replicated, gradients all-reduced), none (one process), or "
        "auto (none for one process; under torchrun ddp while a replica's training state, 16 "
        "bytes a parameter, takes at most 1/8 of a process's memory, else fsdp2).",
        choices=DISTRIBUTED,
    )
    dist_timeout_s: float = option(
        60.0,
        "Seconds a collective waits for the other ranks before the run fails with an error "
        "(a rank that died or hangs); also the process-group set-up timeout.",
    )

    def __post_init__(self) -> None:
        check_choices(self, "trainer")
        check_range("trainer.max_steps", self.max_steps, low=1)
        check_range("trainer.max_nonfinite_steps", self.max_nonfinite_steps, low=1)
        check_range("trainer.max_train_seconds", self.max_train_seconds, low=0.0)
        check_range("trainer.early_stop_patience", self.early_stop_patience, low=0)
        check_range("trainer.early_stop_min_delta", self.early_stop_min_delta, low=0.0)
        stops = self.early_stop_target is not None or self.early_stop_patience
        if stops and not self.eval_every:
            raise ConfigError(
                "the early stop (trainer.early_stop_target / early_stop_patience) decides "
                "after each evaluation, but trainer.eval_every=0 evaluates only at the end: "
                "set trainer.eval_every, or turn the stop off (trainer.early_stop_target=null, "
                "trainer.early_stop_patience=0)"
            )
        check_range("trainer.batch_size", self.batch_size, low=1)
        check_range("trainer.grad_accum_steps", self.grad_accum_steps, low=1)
        if self.batch_size % self.grad_accum_steps:
            raise ConfigError(
                f"trainer.batch_size={self.batch_size} must be divisible by "
                f"trainer.grad_accum_steps={self.grad_accum_steps} "
                "(each micro-batch holds batch_size / grad_accum_steps sequences)"
            )
        check_range("trainer.lr", self.lr, low=0.0, low_open=True)
        check_range("trainer.weight_decay", self.weight_decay, low=0.0)
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ConfigError(
                f"trainer.adam_betas={list(self.adam_betas)} must be two numbers in [0, 1)"
            )
        check_range("trainer.warmup_steps", self.warmup_steps, low=0)
        check_range("trainer.min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        check_range("trainer.max_grad_norm", self.max_grad_norm, low=0.0)
        check_range("trainer.eval_every", self.eval_every, low=0)
        check_range("trainer.eval_samples", self.eval_samples, low=0)
        if self.eval_k and not self.eval_samples:
            raise ConfigError(
                f"trainer.eval_k={self.eval_k} needs sampled completions: set "
                "trainer.eval_samples (n >= k)"
            )
        check_range("trainer.eval_k", self.eval_k, low=0, high=max(self.eval_samples, 0))
        check_range("trainer.save_every", self.save_every, low=0)
        check_range("trainer.keep_last", self.keep_last, low=1)
        check_range("trainer.num_threads", self.num_threads, low=0)
        check_range("trainer.dist_timeout_s", self.dist_timeout_s, low=0.0, low_open=True)
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(
                f"trainer.device={self.device!r} is not allowed; choose auto, cpu, cuda or cuda:N"
            )
        if not self.run_name or "/" in self.run_name:
            raise ConfigError(
                f"trainer.run_name={self.run_name!r} must be a non-empty name without '/'"
            )
