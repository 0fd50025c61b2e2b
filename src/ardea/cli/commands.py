"""The work behind each ``ardea`` subcommand (``train`` in :mod:`ardea.cli.train`)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from ardea.cli.catalog import task_lines
from ardea.config import ArdeaConfig, load_config
from ardea.errors import ArdeaError

console = Console()


def _last_stage_dir(path: Path) -> Path | None:
    """The directory of the last stage of a staged run directory (None for other dirs)."""
    if (path / "checkpoints").is_dir() or not (path / "config.yaml").is_file():
        return None
    stages = list(load_config(path / "config.yaml").stages)
    return path / stages[-1] if stages and (path / stages[-1]).is_dir() else None


def resolve_model_dir(path: str | Path) -> tuple[Path, Path | None]:
    """A run, checkpoint or model directory → (model directory, run config.yaml or None)."""
    path = Path(path)
    if not path.is_dir():
        raise ArdeaError(f"no such directory: {path}")
    last_stage = _last_stage_dir(path)
    if last_stage is not None:  # a run of several stages: its final model is the last one's
        return resolve_model_dir(last_stage)
    if (path / "checkpoints").is_dir():
        from ardea.trainer.checkpoint import latest_checkpoint

        latest = latest_checkpoint(path)
        if latest is None:
            raise ArdeaError(f"run directory {path} has no complete checkpoint yet")
        return latest / "policy", path / "config.yaml"
    if (path / "policy" / "config.json").is_file():
        run_config = path.parent.parent / "config.yaml"
        return path / "policy", run_config if run_config.is_file() else None
    if (path / "config.json").is_file():
        return path, None
    raise ArdeaError(
        f"{path} is neither a run directory (checkpoints/), a checkpoint (policy/) "
        "nor a Hugging Face model directory (config.json)"
    )


def quiet_transformers() -> None:
    """transformers' logging as ardea's commands want it: no per-shard progress bars (ardea
    draws its own progress) and errors only (ardea checks lengths itself and says so).
    Called by each command right before it imports the model code, not at start-up."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _load_for_inference(path: str, overrides: list[str], check=None):
    model_dir, run_config = resolve_model_dir(path)
    config: ArdeaConfig = load_config(run_config, overrides)
    if check is not None:  # the command's own checks of the config, before any loading
        check(config)
    quiet_transformers()  # the model code is imported only once the command line checked out
    from ardea.model import Precision, load_model_and_tokenizer
    from ardea.rollout import EngineSpec, make_engine
    from ardea.trainer.setup import context_length, probe_shapes, resolve_device

    device = resolve_device(config.trainer.device)
    model, tokenizer = load_model_and_tokenizer(
        str(model_dir), dtype=config.model.dtype, device=str(device)
    )
    params = next(model.parameters()).dtype
    precision = Precision.resolve(
        config.model.compute_dtype,
        device,
        params,
        config.model.attn_implementation,
        shapes=probe_shapes(config, model, context_length(model)),
    )
    if precision.probe is not None:
        print(f"[ardea] {precision.probe.describe()}", file=sys.stderr, flush=True)
    spec = EngineSpec.of(model, tokenizer, model_dir=model_dir, precision=precision)
    engine = make_engine(config.rollout.engine, spec, module=model)
    return config, model_dir, tokenizer, engine


def evaluate(args: argparse.Namespace) -> int:
    _check_eval_options(args)

    def needs_task(config: ArdeaConfig) -> None:
        if config.data.task is None:
            raise ArdeaError(
                f"ardea eval measures a task's held-out accuracy, and the config of {args.path} "
                "has data.task=null; name one, e.g. `ardea eval PATH data.task=arithmetic`"
            )

    config, model_dir, tokenizer, engine = _load_for_inference(
        args.path, list(args.args), check=needs_task
    )
    from rich.table import Table

    from ardea.data import make_task, read_examples
    from ardea.trainer.evaluate import SampledEval, evaluate_task

    task = make_task(config.data.task, seed=config.data.seed, **config.data.task_args)
    if args.data is not None:
        examples, source = read_examples(args.data), args.data
    else:
        size = config.data.eval_size
        if args.split == "train":
            size = min(size, config.data.train_size)
        examples, source = task.examples(args.split, size), f"{task.name}/{args.split}"
    sampled = None
    if args.k > 1 or args.num_samples is not None:
        sampled = SampledEval(
            n=args.num_samples or args.k, k=args.k, temperature=config.rollout.temperature,
            top_p=config.rollout.top_p, top_k=config.rollout.top_k,
            max_new_tokens=config.rollout.max_new_tokens, seed=config.trainer.seed,
        )  # fmt: skip
    result = evaluate_task(
        engine,
        tokenizer,
        task,
        examples,
        max_new_tokens=config.rollout.max_new_tokens,
        chat_template=config.data.chat_template,
        batch_size=config.rollout.batch_size,
        sampled=sampled,
    )
    where = f"{model_dir} on {source}: {len(examples)} prompts, the {task.name} verifier"
    console.print(where, soft_wrap=True)
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in result.metrics.items():
        if not name.endswith("_se"):
            se = result.metrics.get(f"{name}_se")
            table.add_row(name, f"{value:.1%}" + ("" if se is None else f" ± {se:.1%}"))
    console.print(table)
    if sampled is not None:
        settings = ", ".join(f"{k}={v}" for k, v in asdict(sampled).items())
        console.print(f"sampled: {settings}")
    for prompt, completion, score in result.samples[: args.show]:
        console.print(f"  {'✓' if score > 0 else '✗'} {prompt!r} → {completion!r}")
    return 0


def _check_eval_options(args: argparse.Namespace) -> None:
    """Refuse option values that cannot mean anything, before a model is loaded."""
    if args.k < 1:
        raise ArdeaError(f"--k {args.k}: pass@k needs k >= 1 (1 = greedy accuracy only)")
    if args.num_samples is not None and args.num_samples < args.k:
        raise ArdeaError(
            f"--num-samples {args.num_samples}: pass@{args.k} needs at least k samples per prompt"
        )
    if args.show < 0:
        raise ArdeaError(f"--show {args.show}: the number of examples to print must be >= 0")


def generate(args: argparse.Namespace) -> int:
    _, _, tokenizer, engine = _load_for_inference(args.path, [])
    from ardea.data import encode_prompt
    from ardea.rollout import SamplingParams

    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=args.max_new_tokens,
        n=args.num_samples,
        seed=args.seed,
    )
    prompts = [encode_prompt(tokenizer, p, chat_template=args.chat) for p in args.prompt]
    completions = engine.generate(prompts, params)
    for i, completion in enumerate(completions):
        text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        prompt = args.prompt[i // params.n]
        print(f"{prompt}{text}" if not args.chat else f"{prompt}\n{text}")
    return 0


def report(args: argparse.Namespace) -> int:
    from ardea.trainer.report import draw_report, draw_stages_report
    from ardea.trainer.trajectory_html import write_trajectories_html

    run_dir = Path(args.run_dir)
    if _last_stage_dir(run_dir) is not None:  # a staged run: each stage, then the overview
        stages = list(load_config(run_dir / "config.yaml").stages)
        for name in stages:
            console.print(f"wrote {draw_report(run_dir / name)}")
            if (page := write_trajectories_html(run_dir / name)) is not None:
                console.print(f"wrote {page}")
        out = draw_stages_report(run_dir, stages)
    else:
        out = draw_report(run_dir)
        if (page := write_trajectories_html(run_dir)) is not None:
            console.print(f"wrote {page}")
    console.print(f"wrote {out}")
    return 0


def tasks(args: argparse.Namespace) -> int:
    from ardea.data import task_names

    for name in task_names():
        print("\n".join(task_lines(name)))
    return 0
