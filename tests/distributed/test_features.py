"""What used to refuse torchrun runs under it: dynamic sampling, background rollouts,
online DPO, an agent environment and an agent workflow over HTTP, each 3 steps in 2 CPU
processes (gloo, FSDP2) against the same run in one process (features.py; one torchrun
launch runs them all to pay the start-up once).

Each rank generates its share of the step's prompts on its own engine, every row seeded by
its global index, and the ranks join the shares: so the 2-process run's first rollout *is*
the one-process run's (the same initial weights), token for token — its rows are equal
(``rollout_rows.json``), its ``rollout/*``, ``reward/*`` and ``agent/*`` metrics are equal,
not close — and its first optimizer step has the same gradients up to
float32 summation order (test_torchrun.py's derivation, for these runs' rows and spans), and
the same ``train/*``, ``loss/*`` and ``critic/*`` metrics up to that rounding (the
advantages, the value loss, the gradient norm: whole-step values at any world size). With
background rollouts (η = 1) the second step's rollout also comes from the initial weights, so
it is equal too. Later steps start from weights that differ by rounding (Adam's first step
amplifies it, test_torchrun.py), so they are only checked to run.

The agent runs' rows arrive in the order their episodes finished, a group's rows apart and
groups of uneven size (the workflow's): the test checks that the first step's micro-batches
were so, which is where finding groups by adjacency gave two ranks the same groups.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from numerics import decoder_gradient_terms, gamma
from run_metrics import FROM_TRAINER, ROLLOUT, assert_same_step_metrics, step_metrics
from test_torchrun import (
    MODEL,
    assert_same_gradients,
    one_and_two_processes,
    run,
    torchrun,
)

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
FEATURES_PY = str(HERE / "features.py")
sys.path.insert(0, str(HERE))
from features import FEATURES, ROLLOUT_ROWS, STEPS, WHOLE_GATHERS  # noqa: E402

#: the step's rows (4 groups of 4: the largest batch here, a refilled one cut back to 4
#: groups; a workflow step of 8 episodes gives at most 16 rows too) and a bound on their
#: length (the longest row of these runs, an agent episode of 3 turns, is under 1024
#: tokens): test_torchrun.py's derivation at that size
GRADIENT_RTOL = gamma(decoder_gradient_terms(MODEL, rows=16, span=1024))
#: a behaviour log-prob against the trainer's, float32 (the runs pin it): one log-prob sums
#: along its longest path the vocabulary's softmax and, per layer, the hidden and MLP widths
#: and the attention span (1024 bounds it, as above), so each side is within gamma_n of its
#: terms' magnitude; log p = logit - logsumexp, each of magnitude about log V for these
#: near-uniform models: 2 * log V * gamma_n = 1.7e-3 (measured: under 1e-6)
LOGPROB_ATOL = (
    2
    * math.log(MODEL.vocab_size)
    * gamma(
        MODEL.vocab_size
        + MODEL.num_hidden_layers * (MODEL.hidden_size + MODEL.intermediate_size + 1024)
    )
)
#: runs whose second step's rollout, too, comes from the initial weights (η = 1, nothing
#: resumed across an update)
BACKGROUND = ("background", "agent_background")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return one_and_two_processes(FEATURES_PY, tmp_path_factory.mktemp("features"), timeout=600)


def rollout_metrics(run_dir: Path, step: int) -> dict[str, float]:
    metrics = step_metrics(run_dir, step).items()
    return {k: v for k, v in metrics if k.startswith(ROLLOUT) and k not in FROM_TRAINER}


def rollout_rows(run_dir: Path, step: int) -> list:
    """Step ``step``'s trained rows, as sorted (group id, token ids) pairs (features.py)."""
    return json.loads((run_dir / ROLLOUT_ROWS).read_text())[step - 1]


def first_step_groups(run_dir: Path) -> list[list[int]]:
    """The group ids of each micro-batch of the first step, rows in order (features.py)."""
    steps = json.loads((run_dir / "micro_batch_groups.json").read_text())
    return [groups for update in steps[0] for groups in update]


@pytest.mark.parametrize("name", list(FEATURES))
def test_a_feature_runs_under_torchrun_as_in_one_process(runs, name):
    one, two = runs / "1" / name, runs / "2" / name
    for run_dir in (one, two):
        assert json.loads((run_dir / "results.json").read_text())["steps"] == STEPS
    same_rollouts = (1, 2) if name in BACKGROUND else (1,)
    for step in same_rollouts:
        expected = rollout_metrics(one, step)
        assert expected and rollout_metrics(two, step) == expected, step
        # each rank generated its share: together, token for token, one process's rollout
        assert rollout_rows(two, step) == rollout_rows(one, step), step
    assert step_metrics(one, 1)["train/grad_norm"] > 0  # a gradient to compare
    assert_same_gradients(one, two, "policy", 1, rtol=GRADIENT_RTOL)
    assert_same_step_metrics(one, two, 1, GRADIENT_RTOL)


def eval_metrics(run_dir: Path, step: int) -> dict[str, float]:
    """What the evaluation at ``step`` logged."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r["step"] == step]
    return {k: v for r in records for k, v in r.items() if k.startswith("eval/")}


@pytest.mark.parametrize("name", [n for n in FEATURES if not n.startswith("workflow")])
def test_the_evaluation_split_over_the_ranks_is_one_processs(runs, name):
    """Each rank evaluates its share of the held-out examples (3 prompts: 2 and 1; an agent's
    2 rows: 1 and 1), greedy and sampled (every completion seeded by its row in the whole
    evaluation), and the ranks gather the scores: at step 0 (the same initial weights) the
    two-process run logs exactly the one-process run's ``eval/*``. (The workflow runs hold
    no held-out rows.)"""
    expected = eval_metrics(runs / "1" / name, 0)
    assert expected and eval_metrics(runs / "2" / name, 0) == expected


#: runs whose every rollout comes from the weights the trainer holds (no background lag)
IN_STEP = [n for n in FEATURES if n not in (*BACKGROUND, "partial", "online_dpo")]


@pytest.mark.parametrize("name", IN_STEP)
def test_every_ranks_engine_generates_with_the_weights_just_trained(runs, name):
    """Each rank generates its share on its own engine, which loads the trained weights
    after every step (under FSDP2 gathered whole one tensor at a time): at steps 2 and 3
    the behaviour log-probs equal the trainer's within float32 rounding on every rank (the
    logged maximum is over both ranks; :data:`LOGPROB_ATOL`). An engine a step behind
    differs by the update, about 2e-2 here (the background runs' lag of one version)."""
    for step in (2, 3):
        mismatch = step_metrics(runs / "2" / name, step)["mismatch/abs_diff_max"]
        assert mismatch <= LOGPROB_ATOL, step
    # and the loop never gathered the whole model for them: each engine read the trainer's
    # FSDP2 shards one tensor at a time (DDP: its own replica)
    assert (runs / "2" / name / WHOLE_GATHERS).read_text() == "0"


@pytest.mark.parametrize("name", ["agent", "workflow", "workflow_in_process"])
def test_agent_rows_arrived_out_of_group_order(runs, name):
    """The first step's micro-batches held a group whose rows are not adjacent, and (the
    workflow's) groups of different sizes: the case the sharding must get right."""
    micro_batches = first_step_groups(runs / "1" / name)
    apart = [g for g in micro_batches if len(set(g)) < sum(1 for i, x in enumerate(g) if i == 0 or x != g[i - 1])]  # fmt: skip
    assert apart, micro_batches
    if name.startswith("workflow"):
        sizes = {g.count(x) for g in micro_batches for x in set(g)}
        assert len(sizes) > 1, micro_batches


def test_dynamic_sampling_refilled_and_online_dpo_trained_on_pairs(runs):
    """The features were exercised: a refill round happened (the rare-digit reward leaves
    groups without a spread), online DPO found pairs at every step, and at one step fewer
    than there are ranks."""
    for world in ("1", "2"):
        refills = [rollout_metrics(runs / world / "dynamic", s) for s in range(1, STEPS + 1)]
        assert any(m["rollout/refill_rounds"] > 0 for m in refills)
        pairs = [rollout_metrics(runs / world / "online_dpo", s)["rollout/pairs"] for s in range(1, STEPS + 1)]  # fmt: skip
        assert min(pairs) > 0
    # a step with fewer pairs than ranks: the other rank trained that micro-batch on a filler
    assert min(rollout_metrics(runs / "2" / "online_dpo", s)["rollout/pairs"] for s in range(1, STEPS + 1)) < 2  # fmt: skip


def test_the_default_recipe_runs_under_torchrun_unchanged(tmp_path):
    """``torchrun --nproc-per-node 2 ardea train``, no config and no override of what it
    runs (its rl stage uses dynamic sampling), shortened to 3 steps a stage and a small
    evaluation: both stages run and the rl stage continues from the sft stage's policy."""
    ardea = str(Path(sys.executable).parent / "ardea")
    short = ["stages.sft.trainer.max_steps=3", "stages.rl.trainer.max_steps=3",
             "data.eval_size=8", "trainer.num_threads=1", "logging.progress=false",
             f"trainer.output_dir={tmp_path}"]  # fmt: skip
    run(torchrun(ardea, "train", *short), timeout=600)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["stages"] == ["sft", "rl"]
    assert results["sft"]["steps"] == results["rl"]["steps"] == 3
    # trainer.distributed=auto replicates a model this small (1/8 of the host's memory)
    assert results["sft"]["distributed"] == {"mode": "ddp", "world_size": 2}
    rl = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").open()]
    assert any("rollout/groups_kept" in r for r in rl)  # dynamic sampling ran


def test_partial_rollouts_run_under_torchrun(tmp_path):
    """rollout.partial under ``torchrun --nproc-per-node 2``: rank 0's worker loads each
    published version at once and the ranks train on its rollouts; where an update lands is
    timing-dependent (so not compared with one process), every token lags by at most η."""
    ardea = str(Path(sys.executable).parent / "ardea")
    overrides = ["configs/online_grpo.yaml", "model.hidden_size=32", "model.num_layers=1",
                 "model.intermediate_size=64", "rollout.max_staleness=1", "rollout.partial=true",
                 "rollout.max_new_tokens=32", "rollout.min_new_tokens=32", "trainer.max_steps=4",
                 "trainer.batch_size=8", "rollout.group_size=4", "trainer.eval_every=0",
                 "trainer.save_every=0", "trainer.num_threads=1", "logging.progress=false",
                 "logging.log_every=1", f"trainer.output_dir={tmp_path}"]  # fmt: skip
    run(torchrun(ardea, "train", *overrides), timeout=600)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    rollouts = [r for r in records if "rollout/staleness" in r]
    assert len(rollouts) == 4 and {r["rollout/staleness"] for r in rollouts} <= {0.0, 1.0}
    assert all(0.0 <= r["rollout/resumed_fraction"] <= 1.0 for r in rollouts)
