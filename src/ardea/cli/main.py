"""``ardea`` command line: train, eval, generate, serve, report, tasks.

User errors (bad config, data, model directory) print one line and exit with status 2;
set ``ARDEA_DEBUG=1`` to see the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ardea.cli.catalog import train_epilog
from ardea.cli.serve import add_serve_parser, serve
from ardea.cli.train import RECIPES, train
from ardea.errors import ArdeaError

EXIT_USER_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ardea", description="Post-train language models with SFT and reinforcement learning."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="run a training recipe (default: the built-in recipe)",
        description="Train from CONFIG.yaml, or without one the default recipe, with "
        "section.key=value overrides.",
        epilog=train_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("args", nargs="*", help="[CONFIG.yaml] [section.key=value ...]")
    train.add_argument(
        "--recipe",
        choices=list(RECIPES),
        help="without CONFIG.yaml: 'default' (the built-in recipe, as when omitted) or "
        "'none' (the top-level config alone: built-in defaults plus the overrides)",
    )
    train.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (for a staged run, each stage's) and exit",
    )
    train.add_argument(
        "--help-config", action="store_true", help="list every config field and exit"
    )

    _add_eval_parser(sub)

    gen = sub.add_parser("generate", help="sample completions of a prompt from a model directory")
    gen.add_argument("path", help="run, checkpoint or Hugging Face model directory")
    gen.add_argument("--prompt", action="append", required=True, help="prompt text (repeatable)")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--num-samples", type=int, default=1)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")

    add_serve_parser(sub)

    rep = sub.add_parser(
        "report",
        help="re-draw report.png from a run's metrics.jsonl, and trajectories.html (the "
        "tokens each logged RL step trained) from its trajectories.jsonl",
    )
    rep.add_argument("run_dir")

    sub.add_parser(
        "tasks", help="list the built-in tasks: description, task_args with defaults, an example"
    )
    return parser


def _add_eval_parser(sub) -> None:
    ev = sub.add_parser(
        "eval", help="accuracy, avg@n, pass@k and maj@k of a run or model on a task's problems"
    )
    ev.add_argument(
        "path", help="run directory, checkpoint directory or Hugging Face model directory"
    )
    ev.add_argument("args", nargs="*", help="config overrides, e.g. data.eval_size=1000")
    ev.add_argument("--split", default="test", choices=["train", "test"])
    ev.add_argument(
        "--data",
        default=None,
        help="a file of {prompt, answer, ...} records to score with the task's verifier, "
        "instead of the task's split",
    )
    ev.add_argument(
        "--k", type=int, default=1, help="report pass@k and maj@k from sampled completions"
    )
    ev.add_argument(
        "--num-samples", type=int, default=None, help="samples per prompt (avg@n; default k)"
    )
    ev.add_argument("--show", type=int, default=5, help="print this many example completions")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The parsed command line; ``key=value`` overrides may also follow the options
    (``ardea eval RUN --k 4 data.eval_size=100``), which argparse alone would refuse."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    overrides = [item for item in extra if not item.startswith("-")]
    if extra and (overrides != extra or not hasattr(args, "args")):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.args = [*args.args, *overrides]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from local directories only
    # imported late: `ardea --help` and every error found in the command line or the config
    # answer before torch and transformers are imported (seconds)
    from ardea.cli import commands

    handler = {
        "train": train,
        "eval": commands.evaluate,
        "generate": commands.generate,
        "serve": serve,
        "report": commands.report,
        "tasks": commands.tasks,
    }[args.command]
    try:
        return handler(args) or 0
    except (ArdeaError, FileNotFoundError) as exc:
        if os.environ.get("ARDEA_DEBUG"):
            raise
        print(f"ardea {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"ardea {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
