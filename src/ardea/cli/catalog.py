"""What ``ardea train --help`` and ``ardea tasks`` list: the default recipe, the ready
configs, the precedence of config values, and the built-in tasks."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import yaml

from ardea.config import DEFAULT_RECIPE

#: the ready configs in the repository's ``configs/`` directory (a test keeps this in step)
READY_CONFIGS = (
    "agent_calculator.yaml",
    "agent_guess_number.yaml",
    "agent_guess_number_agents_sdk.yaml",
    "agent_guess_number_openai.yaml",
    "distill.yaml",
    "dpo.yaml",
    "grpo_offline.yaml",
    "kto.yaml",
    "online_dpo.yaml",
    "online_grpo.yaml",
    "online_grpo_dapo.yaml",
    "online_grpo_prompts.yaml",
    "online_ppo.yaml",
    "online_ppo_adaptive_lambda.yaml",
    "orpo.yaml",
    "reasoning_gym.yaml",
    "reward_model.yaml",
    "reward_model_grpo.yaml",
    "seq_text.yaml",
    "simpo.yaml",
    "sft_arithmetic.yaml",
    "sft_chat.yaml",
    "sft_lora.yaml",
)
#: task arguments a task cannot do without, for its example in ``ardea tasks``
EXAMPLE_TASK_ARGS = {
    "math_jsonl": {"path": "examples/data/gsm8k_mini.jsonl"},
    "reasoning_gym": {"dataset": "chain_sum"},
}

PRECEDENCE = (
    "precedence, lowest first: built-in defaults < CONFIG.yaml's top level < its "
    "stages.NAME values < command-line key=value. A command-line section.key=value applies "
    "to every stage (after the stage's own values), stages.NAME.section.key=value to stage "
    "NAME only: `ardea train trainer.max_steps=5` runs 5 steps of each stage. A command-line "
    "model.path is the model the first stage starts from; later stages start from the "
    "previous stage's final policy unless stages.NAME.model.path is given."
)


def repo_path(relative: str) -> Path | None:
    """``relative`` under the current directory or the ardea checkout (editable install),
    whichever exists first; None when neither does."""
    checkout = Path(__file__).resolve().parents[3]
    for root in (Path.cwd(), checkout):
        if (root / relative).exists():
            return root / relative
    return None


def train_epilog() -> str:
    """The text after ``ardea train --help``'s options."""
    configs_dir = repo_path("configs")
    where = f" ({configs_dir})" if configs_dir is not None else " (in the ardea repository)"
    recipe = (
        f"without CONFIG.yaml, `ardea train` runs the default recipe: {_recipe_summary()}. "
        "`--recipe none` runs the top-level config alone instead (built-in defaults plus "
        "the overrides, one run; the trainer's defaults suit SFT from scratch, online RL "
        "wants the RL stage's lr and schedule), e.g. `ardea train --recipe none "
        "algo.name=online_grpo trainer.lr=2e-4 trainer.lr_schedule=constant "
        "trainer.max_steps=200 trainer.run_name=grpo model.path=DIR`. A run never writes "
        "over another: a run directory that holds one gives way to runs/NAME-2, ... "
        "(trainer.resume=auto continues it). The default recipe's YAML:"
    )
    return "\n".join(
        [
            textwrap.fill(PRECEDENCE, width=88),
            "",
            textwrap.fill(recipe, width=88),
            f"  {DEFAULT_RECIPE}",
            "",
            f"ready configs in configs/{where}:",
            textwrap.fill(
                ", ".join(READY_CONFIGS), width=88, initial_indent="  ", subsequent_indent="  "
            ),
        ]
    )


def _recipe_summary() -> str:
    """``stages sft (sft), rl (online_grpo) in runs/default/``, read from the recipe."""
    recipe = yaml.safe_load(DEFAULT_RECIPE.read_text(encoding="utf-8"))
    stages = ", ".join(
        f"{name} ({(values.get('algo') or {}).get('name', 'sft')})"
        for name, values in recipe["stages"].items()
    )
    return f"stages {stages}, in runs/{recipe['trainer']['run_name']}/"


def task_lines(name: str) -> list[str]:
    """``ardea tasks``' entry for task ``name``: description, arguments, an example."""
    from ardea.data.tasks import make_task, task_class
    from ardea.errors import ArdeaError

    cls = task_class(name)
    doc = (inspect.getdoc(cls) or "").splitlines()
    lines = [f"{name}: {doc[0] if doc else ''}", f"  task_args: {_task_args(cls)}"]
    args = EXAMPLE_TASK_ARGS.get(name, {})
    found = {key: repo_path(value) or value for key, value in args.items()}
    try:
        example = make_task(name, **{k: str(v) for k, v in found.items()}).examples("train", 1)[0]
    except ArdeaError as exc:
        return [*lines, f"  example: {exc}"]
    if args:
        lines.append(f"  example with {', '.join(f'{k}={v}' for k, v in args.items())}:")
    else:
        lines.append("  example:")
    return [*lines, f"    prompt {example.prompt!r}", f"    answer {example.answer!r}"]


def _task_args(cls: type) -> str:
    """The constructor's keyword arguments with their defaults (``seed`` is data.seed)."""
    params = inspect.signature(cls.__init__).parameters.values()
    shown = []
    for p in params:
        if p.name in ("self", "seed"):
            continue
        shown.append(f"{p.name} (required)" if p.default is p.empty else f"{p.name}={p.default!r}")
    return ", ".join(shown) or "(none)"
