"""tinker-cookbook 0.6.1's recipes, unchanged, against ardea's Tinker server.

The commands are the ones ``docs/howto/tinker.md`` shows (read from the page, so the page
cannot drift from what runs), with ``$MODEL`` a small model from random weights and
``$SFT_STATE`` the state the SFT recipe saved. Each runs as its own process, as a user
would type it; the server runs in this one. ~45 s on two cores.
"""

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ardea.service.tinker_server import TinkerServer
from tests.tiny_models import small_model

pytestmark = pytest.mark.slow  # ~35 s: started early under -n 2

REPO = Path(__file__).parents[2]
PAGE = REPO / "docs" / "howto" / "tinker.md"


def recipe_commands() -> dict[str, list[str]]:
    """The page's recipe command lines by recipe (sft, rl, dpo), as argv."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    found = {}
    for line in lines:
        if line.startswith("python -m tinker_cookbook.recipes.chat_sl"):
            found["sft"] = shlex.split(line)
        elif line.startswith("python -m tinker_cookbook.recipes.math_rl"):
            found["rl"] = shlex.split(line)
        elif line.startswith("python examples/tinker/cookbook_dpo.py"):
            found["dpo"] = shlex.split(line)
    assert found.keys() == {"sft", "rl", "dpo"}, f"{PAGE} lost a recipe command: {found}"
    return found


def metrics(log_path: Path, key: str) -> list[float]:
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    return [row[key] for row in rows if key in row]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer):
    """Run the three recipes in order against one server; their log directories."""
    root = tmp_path_factory.mktemp("cookbook")
    model = root / "model"
    small_model(tokenizer, seed=0).save_pretrained(model)
    tokenizer.save_pretrained(model)
    (root / "examples").symlink_to(REPO / "examples")
    env = {
        **os.environ, "TINKER_API_KEY": "tml-test", "TINKER_TELEMETRY": "0",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        # the recipes look up model prices online (5 s timeout): refused at once here
        "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1,localhost",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }  # fmt: skip
    values = {"$MODEL": str(model)}
    with TinkerServer({"tiny": model}, state_dir=root / "state") as server:
        env["TINKER_BASE_URL"] = server.url
        for name, argv in recipe_commands().items():
            argv = [sys.executable, *argv[1:]]
            for placeholder, value in values.items():
                argv = [a.replace(placeholder, value) for a in argv]
            done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True,
                                  timeout=300)  # fmt: skip
            assert done.returncode == 0, f"{name}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            if name == "sft":
                saved = (root / "runs/tinker/sft/checkpoints.jsonl").read_text().splitlines()
                values["$SFT_STATE"] = json.loads(saved[-1])["state_path"]
        yield root / "runs" / "tinker", root / "state"


def test_sft_lowers_the_nll_and_saves_where_the_server_keeps_states(runs):
    logs, state = runs
    nll = metrics(logs / "sft", "train_mean_nll")
    assert len(nll) == 60
    assert sum(nll[-5:]) / 5 < 0.5 * sum(nll[:5]) / 5
    final = json.loads((logs / "sft" / "checkpoints.jsonl").read_text().splitlines()[-1])
    model_id, kind, name = final["state_path"].removeprefix("tinker://").split("/")
    assert (state / model_id / kind / name / "trainer_state.pt").is_file()


def test_rl_raises_the_reward(runs):
    """From the SFT state the tiny model ends some of its answers with the renderer's stop
    sequence (``format`` 1; reward ``correct - 0.1 (1 - format)``, and a model this small
    gets no sum right): RL raises the share. The sampler's and the trainer's log-probs of
    every sampled token agree (the recipe's ``kl_sample_train``), so each step trains on the
    weights it sampled from.

    Each step samples 64 answers, so a step's share is known to about ±0.06, and the
    learning itself varies from run to run (sampling is not seeded): in 8-step runs one in
    about ten stalled below the first step + 0.1 by its last steps. Over 12 steps, in 7 runs
    the mean of the last four steps beat the mean of the first two by 0.12-0.39, so the test
    asks for a rise, not a size (the reward is ``0.1 · format - 0.1`` here, so the share is
    the one figure to check).

    The log-prob bound: sampler and trainer hold the same float32 weights and differ only in
    their kernels' summation order, each product of the width-32 model off by at most
    32 · 2⁻²⁴ ≈ 2e-6 of its size, so a token's log-prob (logits of order 1, two layers and
    the head) moves by ~1e-5 at worst and the recipe's mean difference by no more: 1e-4
    leaves ten times that (measured: |1e-8|). Sampling from the weights before a step would
    differ by that step's change, ~1e-2."""
    formatted = metrics(runs[0] / "rl", "env/all/format")
    print("RL format", [round(f, 3) for f in formatted])
    assert len(formatted) == 12
    assert sum(formatted[-4:]) / 4 > sum(formatted[:2]) / 2, formatted
    kl = metrics(runs[0] / "rl", "optim/kl_sample_train_v1")
    assert len(kl) == 12 and max(abs(x) for x in kl) < 1e-4, kl


def test_dpo_starts_at_ln2_and_learns(runs):
    """The reference is a snapshot of the starting policy, so the first DPO loss is ln 2 to
    float precision (the server's sampler and trainer log-probs agree); then it falls."""
    loss = metrics(runs[0] / "dpo", "dpo_loss")
    margin = metrics(runs[0] / "dpo", "margin")
    assert loss[0] == pytest.approx(math.log(2), abs=1e-4)
    assert abs(margin[0]) < 1e-3
    assert len(loss) == 32 // 16 * 6
    assert sum(loss[-3:]) / 3 < loss[0] - 0.05, loss
