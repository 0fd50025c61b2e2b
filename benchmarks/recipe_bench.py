"""What the recipe benchmarks share: their smoke-mode overrides (2-digit additions, 8
held-out problems, one thread, no TensorBoard, a few steps of an ``sft`` stage), a run's
accuracy curve, where its results go, and the machine line of their reports."""

import json
import platform
from pathlib import Path

import torch

SMOKE_SFT = [
    "data.task_args.digits=2",
    "data.eval_size=8",
    "logging.tensorboard=false",
    "trainer.num_threads=1",
    "stages.sft.data.train_size=32",
    "stages.sft.trainer.max_steps=4",
    "stages.sft.trainer.batch_size=8",
    "stages.sft.trainer.warmup_steps=0",
]
#: the smallest model, for benchmarks whose smoke runs several models
SMALLEST_MODEL = (
    "model={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, intermediate_size: 32}"
)
#: a few steps of the default recipe's ``rl`` stage, no evaluations or checkpoints (so no
#: early stop either: it decides on evaluations)
SMOKE_RL = [
    "stages.rl.trainer.max_steps=2",
    "stages.rl.trainer.batch_size=4",
    "stages.rl.trainer.eval_every=0",
    "stages.rl.trainer.early_stop_target=null",
    "stages.rl.trainer.save_every=0",
]


def curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, held-out accuracy) at every evaluation of a run."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").open()]
    return [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]


def save_rows(out: Path, rows: list) -> None:
    """``out/results.json``: the benchmark's rows."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")


def print_machine() -> None:
    """The report's first line: the processor, torch and its threads."""
    print(f"\n{platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
