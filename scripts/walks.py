"""How much of ardea one piece of work walks through: files and functions a training step
enters, and the call depth from ``ardea train`` to the policy loss's formula.

Each walk runs the real ``ardea train`` in this process (a shipped config, its stages cut to
one or two steps, written under a temporary directory) with a profile hook on every thread,
and counts what the second training step of the last stage calls (from the loop's
``train_step`` call to its return, in every thread): the distinct files of
``src/ardea`` it enters, the distinct functions (file, qualified name) and the threads that
run ardea code. ``--loss`` also prints the stack of ardea frames at the first call of the
policy loss's formula, from ``ardea.cli.main.main`` down.

    python scripts/walks.py            # the three walks: grpo, agent, workflow
    python scripts/walks.py --loss     # and the frames down to the loss

The figures depend on the code, not on the machine; they move when a change adds or
removes a file or a call on the way.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = str(ROOT / "src" / "ardea") + os.sep

WALKS = {
    "grpo": ("configs/online_grpo.yaml", ["trainer.max_steps=2"]),
    "agent": (
        "configs/agent_guess_number.yaml",
        ["stages.sft.trainer.max_steps=1", "stages.rl.trainer.max_steps=2"],
    ),
    "workflow": (
        "configs/agent_guess_number_openai.yaml",
        ["stages.sft.trainer.max_steps=1", "stages.rl.trainer.max_steps=2"],
    ),
}
COMMON = ["trainer.eval_every=0", "trainer.save_every=0", "trainer.early_stop_target=null"]
STAGE_KEYS = ("trainer.eval_every=0", "trainer.save_every=0")

#: the formula the policy loss of the GRPO walk computes (module, function)
LOSS_FORMULA = ("ardea/algo/policy_loss.py", "ppo")


class Walk:
    """A profile hook counting ardea's files and functions while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.steps = 0
        self.files: set[str] = set()
        self.functions: set[tuple[str, str]] = set()
        self.threads: set[int] = set()
        self.loss_stack: list[str] | None = None

    def hook(self, frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event not in ("call", "return"):
            return
        code = frame.f_code
        name = code.co_filename
        if not name.startswith(PACKAGE):
            return
        step = code.co_name == "train_step" and name.endswith("trainer/loop.py")
        if step and event == "return":
            self.active = False
        if step and event == "call":
            self.steps += 1
            self.active = self.steps % 2 == 0  # the second step of each stage
        if not self.active or event == "return":
            return
        relative = name[len(PACKAGE) - len("ardea/") :]
        self.files.add(relative)
        self.functions.add((relative, code.co_qualname))
        self.threads.add(threading.get_ident())
        if self.loss_stack is None and (relative, code.co_name) == LOSS_FORMULA:
            self.loss_stack = stack_of(frame)


def stack_of(frame) -> list[str]:  # noqa: ANN001
    """The ardea frames from the outermost call down to ``frame``."""
    frames = []
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(PACKAGE):
            frames.append(f"{name[len(PACKAGE) - len('ardea/') :]}:{frame.f_code.co_qualname}")
        frame = frame.f_back
    return frames[::-1]


def run_walk(name: str, out: Path) -> Walk:
    """``ardea train`` of the walk's config under the hook; the counts of its last stage's
    second step."""
    from ardea.cli.main import main

    config, overrides = WALKS[name]
    stages = []
    if "stages." in " ".join(overrides):
        stages = [f"stages.{s}.{k}" for s in ("sft", "rl") for k in STAGE_KEYS]
    walk = Walk()
    argv = ["train", str(ROOT / config), *overrides, *COMMON, *stages]
    argv.append(f"trainer.output_dir={out / name}")
    sys.setprofile(walk.hook)
    threading.setprofile(walk.hook)
    try:
        code = main(argv)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    if code != 0:
        raise SystemExit(f"the {name} walk's ardea train exited {code}")
    return walk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "walks", nargs="*", help=f"which walks (default: all of {', '.join(WALKS)})"
    )
    parser.add_argument("--loss", action="store_true", help="print the frames down to the loss")
    parser.add_argument("--files", action="store_true", help="list each walk's files")
    args = parser.parse_args()
    os.chdir(ROOT)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.walks or list(WALKS):
            walk = run_walk(name, Path(tmp))
            rows.append((name, walk))
    print(f"{'walk':10} {'files':>6} {'functions':>10} {'threads':>8} {'loss frames':>12}")
    for name, walk in rows:
        frames = len(walk.loss_stack) if walk.loss_stack else "-"
        print(
            f"{name:10} {len(walk.files):6} {len(walk.functions):10} {len(walk.threads):8} {frames:>12}"
        )
    for name, walk in rows:
        if args.files:
            print(f"\n{name}: files (functions entered)")
            for file in sorted(walk.files):
                count = sum(1 for f, _ in walk.functions if f == file)
                print(f"  {count:4} {file}")
        if args.loss and walk.loss_stack:
            print(f"\n{name}: the frames down to the loss")
            for depth, frame in enumerate(walk.loss_stack, 1):
                print(f"  {depth:2} {frame}")


if __name__ == "__main__":
    main()
