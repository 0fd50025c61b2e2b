"""The GRPO comparison's workloads: the model and prompts both sides train on, the FLOPs of a
step, the floor they are compared with, and the offline subprocess runner
(:mod:`bench_grpo_vs_trl` documents the figures; ``bench_compute_dtype`` reuses the peak)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclasses.dataclass(frozen=True)
class Workload:
    """Model shape, batch and run lengths (module docstring)."""

    name: str = "3M"
    digits: int = 2  # operands of the prompts' additions
    hidden: int = 256
    intermediate: int = 768
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    prompts: int = 8
    group: int = 8
    new_tokens: int = 64
    lr: float = 1e-5
    warmup: int = 2
    steps: int = 5
    repeats: int = 3
    dataset: int = 256


TEN_M = Workload(
    name="10M", digits=3, hidden=384, intermediate=1152, layers=6, heads=6, kv_heads=2,
    new_tokens=48,
)  # fmt: skip
WORKLOADS = {"3M": Workload(), "10M": TEN_M}

SMOKE = Workload(
    name="smoke", hidden=32, intermediate=64, layers=2, heads=2, kv_heads=1, prompts=2, group=2,
    new_tokens=8, warmup=1, steps=1, repeats=1, dataset=16,
)  # fmt: skip


# ------------------------------------------------------------------ inputs
def build_model(work: Workload):
    """``(tokenizer, model)``: ardea's character tokenizer and the workload's tiny Qwen2
    (tied embeddings, seed 0)."""
    from ardea.model import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer(model_max_length=128)
    model = build_tiny_model(
        tokenizer, hidden_size=work.hidden, num_layers=work.layers, num_heads=work.heads,
        num_kv_heads=work.kv_heads, intermediate_size=work.intermediate,
        max_position_embeddings=128, tie_word_embeddings=True, seed=0,
    )  # fmt: skip
    return tokenizer, model


def write_inputs(work: Workload, root: Path) -> tuple[Path, Path, dict]:
    """The model + tokenizer directory and the prompt JSONL; returns them and the shape
    figures the FLOP count needs."""
    from ardea.model.flops import model_flops

    transformers.utils.logging.disable_progress_bar()
    tokenizer, model = build_model(work)
    model_dir = root / f"model-{work.name}"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    rng = random.Random(0)
    data = root / f"prompts-{work.name}.jsonl"
    low, high = 10 ** (work.digits - 1), 10**work.digits - 1
    with data.open("w", encoding="utf-8") as handle:
        for _ in range(work.dataset):
            a, b = rng.randint(low, high), rng.randint(low, high)
            handle.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    shape = {
        "prompt_tokens": len(tokenizer(f"{low}+{low}=", add_special_tokens=False)["input_ids"]),
        "parameters": sum(p.numel() for p in model.parameters()),
        "sizes": model_flops(model),
    }
    return model_dir, data, shape


def realistic_inputs(work: Workload, root: Path, threads: int, sft: Path | None, smoke: bool):
    """The realistic case's model and prompts: the default recipe's SFT checkpoint (its
    ``sft`` stage run here through ``ardea train`` unless ``sft`` names one) and 3-digit
    additions of the recipe's task, ``{"prompt": "347+589=", "answer": "936"}``."""
    from omegaconf import OmegaConf

    from ardea.config.loader import DEFAULT_RECIPE
    from ardea.data.tasks import make_task

    recipe = OmegaConf.load(DEFAULT_RECIPE)
    if sft is None:
        stage = OmegaConf.merge({k: v for k, v in recipe.items() if k != "stages"},
                                recipe.stages.sft)  # fmt: skip
        run_dir = root / "recipe-sft"
        stage.trainer.output_dir = str(run_dir)
        stage.trainer.num_threads = threads
        stage.logging = {"progress": False, "tensorboard": False}
        if smoke:  # seconds: a tiny model, a few steps
            stage.trainer.max_steps = 4
            stage.model = {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64}
        path = root / "recipe-sft.yaml"
        OmegaConf.save(stage, path)
        ardea = Path(sys.executable).parent / "ardea"
        run_offline(
            [str(ardea), "train", str(path)], "ardea train (the default recipe's SFT stage)"
        )
        sft = sorted((run_dir / "checkpoints").glob("step_*"))[-1] / "policy"
    task = make_task(recipe.data.task, **recipe.data.task_args)
    data = root / "realistic-prompts.jsonl"
    with data.open("w", encoding="utf-8") as handle:
        for example in task.examples("train", work.dataset):
            handle.write(json.dumps({"prompt": example.prompt, "answer": example.answer}) + "\n")
    return sft, data


def step_flops(work: Workload, shape: dict, *, reference: bool) -> dict[str, float]:
    """FLOPs of one optimizer step, counted as ardea counts its own runs
    (:class:`ardea.model.flops.ModelFlops`), split into ``decode`` (each of the ``N`` rows'
    ``P + R - 1`` fed positions, the head on the ``R`` sampled ones: every row prefills its own
    prompt, as ``generate()`` does) and ``train`` (forward + backward = 3 forwards of all
    ``P + R`` positions, and the reference's forward)."""
    sizes, seq = shape["sizes"], shape["prompt_tokens"] + work.new_tokens
    n = work.prompts * work.group
    return {
        "decode": n * sizes.forward(seq - 1, 0, work.new_tokens),
        "train": n * (4 if reference else 3) * sizes.forward(seq),
    }


def floor_rates(
    work: Workload, shape: dict, dtype: torch.dtype, budget_s: float, parts=("train", "decode")
) -> dict:
    """GFLOP/s of ardea's probe products (:func:`ardea.model.dtype_probe.linear_gflops`: an
    MLP up-projection in ``dtype`` from fp32 parameters) at the step's two shapes: all ``N ×
    (P + R)`` tokens of a training forward (``F.linear`` under autocast), and the ``N`` rows
    of one decode step (the engine's packed linear, the weight cast and laid out once)."""
    from ardea.model.dtype_probe import linear_gflops

    n = work.prompts * work.group
    tokens = n * (shape["prompt_tokens"] + work.new_tokens)
    cpu, f32 = torch.device("cpu"), torch.float32
    sizes = (work.hidden, work.intermediate, budget_s)
    rows = {"train": tokens, "decode": n}
    return {
        part: linear_gflops(cpu, dtype, f32, rows[part], *sizes, packed=part == "decode")
        for part in parts
    }


def floor_seconds(flops: dict[str, float], rates: dict[str, float]) -> float:
    """The step's floor: each part's FLOPs at its shape's rate."""
    return sum(flops[part] / (rates[part] * 1e9) for part in ("train", "decode"))


def matmul_peak(dtype: torch.dtype, n: int, repeats: int = 5) -> float:
    """Best GFLOP/s of ``n × n`` ``torch.matmul`` in ``dtype`` (2n³ FLOPs each)."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.matmul(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(3):
            torch.matmul(a, b)
        best = min(best, (time.perf_counter() - start) / 3)
    return 2.0 * n**3 / best / 1e9


def run_offline(command: list[str], what: str) -> None:
    """Run ``command`` offline (no hub); exit with its output tail when it fails."""
    env = {**os.environ, **OFFLINE}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"{what} failed with status {done.returncode}:\n{tail}")
