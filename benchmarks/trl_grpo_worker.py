"""TRL's side of ``bench_grpo_vs_trl.py``: ``GRPOTrainer`` on the benchmark's workload.

Runs in the TRL benchmark environment (TRL, transformers, torch; no ardea there) and is
started by ``bench_grpo_vs_trl.py``, never by hand:

    python trl_grpo_worker.py SPEC.json OUT.json

SPEC holds the model directory, the prompt JSONL and the settings; OUT receives the
``time.perf_counter()`` of every ``on_step_begin`` and ``on_step_end`` callback (one optimizer
step each: gradient accumulation is 1), the versions used and the GRPOConfig fields set.
"""

from __future__ import annotations

import json
import sys
import time


def exact_match(prompts, completions, answer, **kwargs):
    """1 where the completion, stripped, equals the ``answer`` column, stripped."""
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer)]


def grpo_settings(spec: dict) -> dict:
    """GRPOConfig fields: one optimizer step = ``prompts × group`` completions in a single
    micro-batch, generated in one round; TRL's bf16 and gradient-checkpointing defaults are
    overridden explicitly; no logging, saving or progress bar."""
    completions = spec["prompts"] * spec["group"]
    return {
        "per_device_train_batch_size": completions,
        "gradient_accumulation_steps": 1,
        "num_generations": spec["group"],
        "generation_batch_size": completions,
        "max_completion_length": spec["max_new_tokens"],
        "generation_kwargs": {"min_new_tokens": spec["min_new_tokens"]},
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "num_iterations": 1,
        "beta": spec["beta"],
        "epsilon": 0.2,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "learning_rate": spec["lr"],
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "bf16": spec["bf16"],
        "gradient_checkpointing": False,
        "use_cpu": True,
        "max_steps": spec["steps"],
        "seed": spec["seed"],
        "logging_strategy": "no",
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def main(spec_path: str, out_path: str) -> None:
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin: list[float] = []
            self.end: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.end.append(time.perf_counter())

    with open(spec["data"], encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    settings = grpo_settings(spec)
    timer = StepTimer()
    trainer = trl.GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32),
        reward_funcs=[exact_match],
        args=trl.GRPOConfig(output_dir=spec["output_dir"], **settings),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(spec["model"]),
        callbacks=[timer],
    )
    trainer.train()
    result = {
        "step_begin": timer.begin,
        "step_end": timer.end,
        "settings": settings,
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "threads": torch.get_num_threads(),
    }
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main(*sys.argv[1:3])
