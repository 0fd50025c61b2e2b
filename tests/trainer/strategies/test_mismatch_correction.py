"""algo.mismatch is applied: the ratio is taken against the policy before the updates and
each token's loss is weighted by the correction (a run that ignored the mode would train
on the unweighted loss)."""

import pytest
import torch
from strategy_testing import online_strategy, rollout_batch, tiny_policy

from ardea.algo import PolicyLossInputs, correction_weights, ppo
from ardea.errors import ConfigError
from ardea.trainer.step.updates import read_metrics

LENGTHS, PROMPT, REWARDS = [7, 8, 6, 8], 3, [1.0, 0.0, 0.5, 0.25]


def loss_of(strategy, batch):
    pinned = strategy.pin(strategy.scorers.pin(batch, {}), {})  # as the RL step pins
    loss, metrics = strategy.loss(pinned, strategy.step_counts([pinned]))
    return pinned, (loss, read_metrics(metrics))  # metrics as the trainer reads them


def test_masking_every_token_leaves_no_policy_loss():
    """token_mis with low = high = 1: the behaviour log-probs (-0.5) are not the policy's,
    so no token has weight 1 and every token is masked; without the mode they all count."""
    batch = rollout_batch(LENGTHS, PROMPT, REWARDS)
    masked = online_strategy("online_grpo", tiny_policy(), mismatch_mode="token_mis",
                             mismatch_low=1.0, mismatch_high=1.0)  # fmt: skip
    _, (loss, metrics) = loss_of(masked, batch)
    assert metrics["mismatch/correction_masked_frac"] == 1.0
    assert float(loss) == 0.0
    plain = online_strategy("online_grpo", tiny_policy())
    _, (loss, _) = loss_of(plain, batch)
    assert float(loss) != 0.0


@pytest.mark.parametrize(
    ("mode", "options"),
    [
        ("token_tis", {"mismatch_cap": 1.5}),
        ("seq_tis", {"mismatch_cap": 1.5}),
        ("token_mis", {"mismatch_low": 0.0, "mismatch_high": 1.5}),
        ("seq_mis", {"mismatch_low": 0.0, "mismatch_high": 1e9}),
    ],
)
def test_the_loss_is_ppo_on_corrected_advantages(mode, options):
    """Every mode: the loss equals PPO against the proximal policy with each advantage
    multiplied by the mode's weights, computed here from the pinned tensors; the weights are
    not all 1 (the behaviour log-probs, -0.5, are not the policy's), so a run that ignored
    the mode would give another loss."""
    batch = rollout_batch(LENGTHS, PROMPT, REWARDS)
    strategy = online_strategy("online_grpo", tiny_policy(), mismatch_mode=mode, **options)
    pinned, (loss, _) = loss_of(strategy, batch)
    mask = pinned.action_mask
    settings = {k.removeprefix("mismatch_"): v for k, v in options.items()}
    weights = correction_weights(pinned.proximal_logprobs, pinned.behaviour_logprobs, mask,
                                 mode=mode, **settings)  # fmt: skip
    assert not torch.allclose(weights[mask], torch.ones(int(mask.sum()), dtype=weights.dtype))
    logprobs = strategy.policy_logprobs(pinned)  # the policy has not moved: = proximal
    expected, _ = ppo(PolicyLossInputs(logprobs, pinned.proximal_logprobs,
                                       pinned.advantages * weights, mask), eps_clip=0.2)  # fmt: skip
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-7)
    ignored, _ = ppo(PolicyLossInputs(logprobs, pinned.behaviour_logprobs, pinned.advantages,
                                      mask), eps_clip=0.2)  # fmt: skip
    assert not torch.allclose(loss.detach(), ignored, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("online_grpo", {"policy_loss": "decoupled_ppo"}, "decoupled PPO weights"),
        ("online_grpo", {"policy_loss": "gspo"}, "choose seq_tis or seq_mis"),
        ("grpo", {}, "online strategies"),
    ],
)
def test_combinations_that_cannot_work_are_errors(name, options, message):
    with pytest.raises(ConfigError, match=message):
        online_strategy(name, tiny_policy(), mismatch_mode="token_tis", **options)
