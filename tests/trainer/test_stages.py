"""Staged runs: every stage validated before any work, each stage starting from the
previous one's final policy, combined results, resume of a staged run."""

import json

import pytest
from tiny_models import SMALL_OVERRIDES

from ardea.config import DEFAULT_RECIPE, load_config, stage_configs
from ardea.errors import ArdeaError
from ardea.trainer import Trainer, run

TINY = [
    *SMALL_OVERRIDES,
    "data.task_args.digits=2",
    "data.eval_size=16",
    "trainer.num_threads=1",
    "logging.progress=false",
    "logging.tensorboard=false",
]
STAGES = (
    "stages={sft: {algo: {name: sft}, data: {train_size: 64}, "
    "trainer: {max_steps: 4, batch_size: 8, eval_every: 0}}, "
    "rl: {algo: {name: online_grpo}, rollout: {group_size: 2, max_new_tokens: 4}, "
    "trainer: {max_steps: 3, batch_size: 4, lr: 1e-4, eval_every: 0, save_every: 2}}}"
)


def test_default_recipe_is_sft_then_online_rl():
    stages = stage_configs(load_config(DEFAULT_RECIPE))
    assert [(name, config.algo.name) for name, config in stages] == [
        ("sft", "sft"),
        ("rl", "online_grpo"),
    ]
    sft, rl = stages[0][1], stages[1][1]
    assert sft.data.train_size <= 5000  # scarce demonstrations: 3,000 of a million sums
    assert sft.data.task_args["drop_carry"] > 0  # ... by a sloppy demonstrator
    assert rl.data.train_size >= 10 * sft.data.train_size  # fresh prompts for RL
    assert sft.data.task == rl.data.task == "arithmetic"


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("stages.rl.trainer.max_step=3", r"unknown config key 'trainer.max_step' \(stages.rl\)"),
        ("stages.rl.trainer.lr=-1", r"trainer.lr=-1.*\(stages.rl\)"),
        ("stages.rl.algo.name=nope", r"unknown strategy algo.name='nope'.*\(stages.rl\)"),
        (
            "stages.rl.reward.functions=[{name: nope}]",
            r"reward\.functions\[0\]: unknown reward function 'nope'.*\(stages\.rl\)",
        ),
        ("stages.rl.data.task_args.digit=2", r"unknown argument\(s\) digit.*\(stages\.rl\)"),
        (
            "stages.rl.model.path=/nonexistent",
            r"model\.path directory /nonexistent .*\(stages\.rl\)",
        ),
        ("data.task=nope", r"unknown task data\.task='nope'.*\(stages\.sft\)"),
    ],
)
def test_a_bad_later_stage_fails_before_any_work(override, match, tmp_path):
    config = load_config(None, [*TINY, STAGES, override, f"trainer.output_dir={tmp_path / 'r'}"])
    with pytest.raises(ArdeaError, match=match):
        run(config)
    assert not (tmp_path / "r").exists()


def count_training_steps(monkeypatch) -> list[str]:
    """Patch ``Trainer.train_step`` to record the stage (run directory name) of every
    training step taken."""
    taken: list[str] = []
    train_step = Trainer.train_step

    def counted(self):
        taken.append(self.run_dir.name)
        return train_step(self)

    monkeypatch.setattr(Trainer, "train_step", counted)
    return taken


def test_stages_chain_and_resume(tmp_path, monkeypatch):
    overrides = [*TINY, STAGES, f"trainer.output_dir={tmp_path / 'run'}"]
    results = run(load_config(None, overrides))
    top = tmp_path / "run"
    saved = json.loads((top / "results.json").read_text())
    assert saved["stages"] == ["sft", "rl"]
    assert (top / "report.png").is_file() and (top / "rl" / "report.png").is_file()
    sft_final = top / "sft" / "checkpoints" / "step_0000004" / "policy"
    assert saved["sft"]["checkpoint"] == str(sft_final)
    rl_config = load_config(top / "rl" / "config.yaml")
    assert rl_config.model.path == str(sft_final)  # the RL stage starts from the SFT policy
    # the RL stage's first evaluation is the SFT stage's last one: same weights, same prompts
    assert saved["accuracy_before_rl"] == saved["sft"]["accuracy"]
    assert saved["accuracy_after_rl"] == saved["rl"]["accuracy"]
    assert saved["wall_seconds"] >= saved["sft"]["wall_seconds"] + saved["rl"]["wall_seconds"] - 1
    assert results["checkpoint"] == str(top / "rl" / "checkpoints" / "step_0000003" / "policy")
    # resume=auto: a finished run trains nothing again and reports the same figures
    taken = count_training_steps(monkeypatch)
    again = run(load_config(None, [*overrides, "trainer.resume=auto"]))
    assert taken == []
    for key in ("accuracy_before_rl", "accuracy_after_rl"):
        assert again[key] == saved[key]
    assert again["rl"]["steps"] == 3 and again["sft"]["steps"] == 4


def test_an_interrupted_stage_resumes_exactly(tmp_path, monkeypatch, auto_compute_dtype):
    """Bit for bit under either answer of ``compute_dtype=auto`` (the tiny stages leave it
    to auto): the resumed process computes in what the first one did."""
    import shutil

    import torch
    from safetensors.torch import load_file

    overrides = [*TINY, STAGES, f"trainer.output_dir={tmp_path / 'run'}"]
    run(load_config(None, overrides))
    final = tmp_path / "run" / "rl" / "checkpoints" / "step_0000003"
    expected = load_file(final / "policy" / "model.safetensors")
    shutil.rmtree(final)  # as if killed between the RL stage's checkpoints 2 and 3
    taken = count_training_steps(monkeypatch)
    again = run(load_config(None, [*overrides, "trainer.resume=auto"]))
    assert taken == ["rl"]  # only the RL stage's last step is trained again
    assert again["rl"]["steps"] == 3
    resumed = load_file(final / "policy" / "model.safetensors")
    assert all(torch.equal(expected[k], resumed[k]) for k in expected)


RM_STAGES = (
    "stages={sft: {algo: {name: sft}, data: {train_size: 64}, "
    "trainer: {max_steps: 3, batch_size: 8, eval_every: 0}}, "
    "rm: {algo: {name: reward_model}, data: {train_size: 64}, "
    "trainer: {max_steps: 2, batch_size: 8, eval_every: 0}}, "
    "rl: {algo: {name: online_grpo}, model: {path: 'stage:sft'}, "
    "reward: {functions: [{name: reward_model, kwargs: {path: 'stage:rm'}}]}, "
    "rollout: {group_size: 2, max_new_tokens: 4}, "
    "trainer: {max_steps: 2, batch_size: 4, lr: 1e-4, eval_every: 0}}}"
)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        (
            "stages.rl.model.path=stage:rl",
            r"model\.path=stage:'rl' names no earlier stage.*sft, rm",
        ),
        (
            "stages.rl.reward.functions=[{name: reward_model, kwargs: {path: 'stage:nope'}}]",
            r"reward\.functions\[0\]\.kwargs\.path=stage:'nope' names no earlier stage",
        ),
        (
            "stages.rl.reward.functions=[{name: reward_modl, kwargs: {path: 'stage:rm'}}]",
            r"unknown reward function 'reward_modl'.*\(stages\.rl\)",
        ),
        ("stages.sft.model.path=stage:rm", r"none: this is the first stage.*\(stages\.sft\)"),
    ],
)
def test_a_bad_stage_reference_fails_before_any_work(override, match, tmp_path):
    overrides = [*TINY, RM_STAGES, override, f"trainer.output_dir={tmp_path / 'r'}"]
    with pytest.raises(ArdeaError, match=match):
        run(load_config(None, overrides))
    assert not (tmp_path / "r").exists()


def test_stages_name_earlier_stages_models(tmp_path):
    """sft → a reward model from the SFT policy → RL from the SFT policy (not the reward
    model, the previous stage) scored by the reward model."""
    top = tmp_path / "run"
    results = run(load_config(None, [*TINY, RM_STAGES, f"trainer.output_dir={top}"]))
    sft_final = top / "sft" / "checkpoints" / "step_0000003" / "policy"
    rm_final = top / "rm" / "checkpoints" / "step_0000002" / "policy"
    assert load_config(top / "rm" / "config.yaml").model.path == str(sft_final)
    rl = load_config(top / "rl" / "config.yaml")
    assert rl.model.path == str(sft_final)
    assert rl.reward.functions[0].kwargs["path"] == str(rm_final)
    rewards = [
        json.loads(line)["rollout/reward_mean"]
        for line in (top / "rl" / "metrics.jsonl").open()
        if "rollout/reward_mean" in line
    ]
    assert rewards and all(r != 0.0 for r in rewards)  # scored by the trained RM's logits
    assert results["rm"]["strategy"] == "reward_model"
