"""Every online step logs the train-inference mismatch of its rollout, measured before the
step's first update: with the in-process engine in float32 the behaviour log-probs are the
trainer's to rounding (mean |d| <= 1e-5), while later updates of the same step (after the
first optimizer step) see a moved policy."""

import pytest
from online_testing import RUN, metrics

from ardea.config import load_config
from ardea.trainer import Trainer


def test_mismatch_is_measured_before_the_first_update(tmp_path, reward_module):
    run = [*RUN, "trainer.max_steps=3", "algo.ppo_mini_batches=2", f"trainer.output_dir={tmp_path}"]
    Trainer(load_config(None, run)).train()
    steps = [m for m in metrics(tmp_path) if "train/loss" in m]
    assert len(steps) == 3
    for step in steps:
        assert step["mismatch/abs_diff_mean"] <= 1e-5
        assert step["mismatch/abs_diff_max"] <= 1e-4
        assert abs(step["mismatch/kl_k3"]) <= 1e-8
        assert step["mismatch/ratio_outside"] == 0.0 == step["mismatch/seq_ratio_outside"]
        # the mean over both updates sees the second one's moved policy
        assert step["loss/approx_kl"] > 1e-6


def test_truncated_sampling_keeps_the_first_ratio_at_one(tmp_path, reward_module):
    """rollout.top_p=0.8 and top_k=5: the trainer's log-probs are those of the truncated
    distribution the engine sampled from (the batch records it), so the ratio stays 1."""
    run = [*RUN, "trainer.max_steps=2", "rollout.top_p=0.8", "rollout.top_k=5",
           f"trainer.output_dir={tmp_path}"]  # fmt: skip
    Trainer(load_config(None, run)).train()
    for step in (m for m in metrics(tmp_path) if "train/loss" in m):
        assert abs(step["mismatch/ratio_mean"] - 1.0) <= 0.01
        assert step["mismatch/abs_diff_mean"] <= 1e-5


@pytest.mark.parametrize("algo", ["online_grpo", "online_ppo"])
def test_a_correction_mode_runs_end_to_end(tmp_path, reward_module, algo):
    """With algo.mismatch set the rollout gets the policy's own log-probs pinned and the
    weights are logged; the in-process engine in float32 needs no correction (w = 1)."""
    run = [*RUN, f"algo.name={algo}", "trainer.max_steps=2", "algo.mismatch.mode=seq_tis",
           "algo.mismatch.cap=1.5", f"trainer.output_dir={tmp_path}"]  # fmt: skip
    Trainer(load_config(None, run)).train()
    for step in (m for m in metrics(tmp_path) if "train/loss" in m):
        assert abs(step["mismatch/correction_weight_mean"] - 1.0) <= 1e-4
        assert step["mismatch/correction_masked_frac"] == 0.0
