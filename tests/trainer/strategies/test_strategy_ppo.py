"""``online_ppo`` (seed 001's PPO strategy cases): the critic, the loss, behaviour log-prob
validation, GAE pinned on the rollout, KL folded into rewards, the critic's own step."""

from dataclasses import replace

import pytest
import torch
from numerics import assert_gradients_close, decoder_gradient_terms, gamma
from strategy_testing import online_strategy, rollout_batch, run_step, tiny_policy

import ardea.trainer.strategies.online_ppo as online_ppo_module
from ardea.trainer.step.updates import read_metrics
from ardea.trainer.strategies import strategy_class
from ardea.trainer.strategies.online_ppo import OnlinePPOStrategy

LENGTHS = [7, 9, 6, 8]
PROMPT = 3
REWARDS = [1.0, 0.0, 0.5, -1.0]


def ppo(**algo):
    options = {"ppo_kl_ctl": 0.01, "ppo_kl_estimator": "k1", "ppo_gae_lambda": 0.95}
    return online_strategy("online_ppo", tiny_policy(), **(options | algo))


def prepared(strategy, batch=None):
    batch = batch if batch is not None else rollout_batch(LENGTHS, PROMPT, REWARDS)
    return strategy.pin(strategy.scorers.pin(batch, {}), {})  # as the RL step pins


def loss_of(strategy, pinned):
    loss, metrics = strategy.loss(pinned, strategy.step_counts([pinned]))
    return loss, read_metrics(metrics)  # as the trainer reads them


def test_registered_as_online_ppo():
    assert strategy_class("online_ppo") is OnlinePPOStrategy
    assert OnlinePPOStrategy.sample_kind == "prompt"


def test_critic_warm_starts_from_the_policy_with_a_zero_head():
    strategy = ppo()
    policy_backbone = strategy.policy.model.state_dict()
    critic_backbone = strategy.critic.model.state_dict()
    assert policy_backbone.keys() == critic_backbone.keys()
    assert all(torch.equal(policy_backbone[k], critic_backbone[k]) for k in policy_backbone)
    assert critic_backbone["embed_tokens.weight"].data_ptr() != (
        policy_backbone["embed_tokens.weight"].data_ptr()
    )  # a copy, not shared
    batch = rollout_batch(LENGTHS, PROMPT, REWARDS)
    with torch.no_grad():
        values = strategy.critic(batch.input_ids, batch.attention_mask)
    assert values.shape == (4, 9) and torch.count_nonzero(values) == 0


def test_loss_is_finite_and_differentiable_for_policy_and_critic():
    strategy = ppo()
    pinned = prepared(strategy)
    loss, metrics = loss_of(strategy, pinned)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in strategy.policy.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in strategy.critic.parameters())
    for name in ("loss/policy", "loss/value", "train/entropy", "loss/clip_frac"):
        assert name in metrics


def test_reference_gets_no_gradient():
    strategy = ppo()
    loss, _ = loss_of(strategy, prepared(strategy))
    loss.backward()
    assert all(
        p.grad is None and not p.requires_grad for p in strategy.reference.model.parameters()
    )


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [
        (lambda b: replace(b, logprobs=None), "carries no behaviour log-probs"),
        (lambda b: replace(b, logprobs=torch.zeros(1)), r"logprobs: must have shape"),
        (
            lambda b: replace(
                b, logprobs=b.logprobs.index_fill(1, torch.tensor([4]), float("nan"))
            ),
            r"logprobs: must be finite on trained tokens \(row 0\)",
        ),
    ],
    ids=["missing", "shape", "nonfinite"],
)
def test_bad_behaviour_logprobs_are_rejected(corrupt, match):
    strategy = ppo()
    with pytest.raises(ValueError, match=match):
        prepared(strategy, corrupt(rollout_batch(LENGTHS, PROMPT, REWARDS)))


def test_zero_advantages_returns_and_head_give_zero_loss():
    """Zero-head critic (V = 0), advantages 0 and returns 0: both terms vanish."""
    strategy = ppo()
    pinned = prepared(strategy)
    pinned = pinned.pin(
        advantages=torch.zeros_like(pinned.advantages), returns=torch.zeros_like(pinned.returns)
    )
    loss, metrics = loss_of(strategy, pinned)
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    assert metrics["loss/value"] == pytest.approx(0.0, abs=1e-7)


def test_all_masked_completion_tokens_give_zero_loss():
    strategy = ppo()
    pinned = prepared(strategy)
    pinned = replace(pinned, loss_mask=torch.zeros_like(pinned.loss_mask))
    loss, _ = loss_of(strategy, pinned)
    assert loss.item() == pytest.approx(0.0, abs=1e-7)


def test_pinned_advantages_are_not_recomputed_by_the_loss(monkeypatch):
    strategy = ppo()
    pinned = prepared(strategy)

    def fail(*args, **kwargs):
        raise AssertionError("the loss must use the advantages pinned on the rollout")

    monkeypatch.setattr(online_ppo_module, "compute_advantages", fail)
    # for a constant advantage c > 0 the clipped surrogate -mean(min(r c, clip(r) c)) is
    # c times its value at c = 1, and 0 at c = 0: the loss follows the pinned values
    policy_loss = {}
    for c in (0.0, 1.0, 2.0):
        pinned = pinned.pin(advantages=torch.full_like(pinned.advantages, c))
        policy_loss[c] = loss_of(strategy, pinned)[1]["loss/policy"]
    assert policy_loss[0.0] == pytest.approx(0.0, abs=1e-7)
    assert policy_loss[1.0] != pytest.approx(0.0, abs=1e-4)
    assert policy_loss[2.0] == pytest.approx(2 * policy_loss[1.0], rel=1e-5)


def test_padding_gets_zero_advantages_and_returns():
    strategy = ppo()
    pinned = prepared(strategy)
    off = ~pinned.action_mask
    assert torch.count_nonzero(pinned.advantages[off]) == 0
    assert torch.count_nonzero(pinned.returns[off]) == 0
    assert torch.count_nonzero(pinned.advantages[pinned.action_mask]) > 0


def fixed_critic(values):
    class Critic(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None):
            return values.clone()

    return Critic()


def test_gae_by_hand_with_fixed_values():
    """One row: 3 prompt tokens, 3 completion tokens (ending with eos), reward 2, gamma 1,
    lambda 0.95, critic values 0.1 / 0.2 / 0.3 at the three emitting positions."""
    strategy = ppo(ppo_kl_ctl=0.0)
    batch = rollout_batch([6], PROMPT, [2.0])
    values = torch.tensor([[0.0, 0.0, 0.1, 0.2, 0.3, 0.0]])  # next-token aligned
    strategy.critic = fixed_critic(values)
    pinned = prepared(strategy, batch)
    a4 = 2.0 - 0.3
    a3 = (0.3 - 0.2) + 0.95 * a4
    a2 = (0.2 - 0.1) + 0.95 * a3
    expected = torch.tensor([[0.0, 0.0, a2, a3, a4, 0.0]])
    torch.testing.assert_close(pinned.advantages, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(pinned.returns, expected + values * (expected != 0))
    torch.testing.assert_close(pinned.old_values, values)


def test_truncated_completion_bootstraps_from_its_last_value():
    """no_eos: the value after the last token stands in for the unseen rest (gamma 1,
    lambda 1: every advantage is V_last + r - V_t)."""
    strategy = ppo(ppo_kl_ctl=0.0, ppo_gae_lambda=1.0)
    batch = rollout_batch([6], PROMPT, [0.0], no_eos=[True])
    values = torch.tensor([[0.0, 0.0, 0.1, 0.2, 0.3, 0.7]])
    strategy.critic = fixed_critic(values)
    pinned = prepared(strategy, batch)
    expected = torch.tensor([[0.0, 0.0, 0.7 - 0.1, 0.7 - 0.2, 0.7 - 0.3, 0.0]])
    torch.testing.assert_close(pinned.advantages, expected, atol=1e-6, rtol=0)


def test_kl_penalty_is_folded_into_the_rewards(monkeypatch):
    """Behaviour log-prob 1 and reference log-prob 0 on both completion tokens: each token's
    reward loses kl_ctl * (1 - 0) = 0.01 (k1); the last one also gets the outcome 1."""
    strategy = ppo(ppo_kl_ctl=0.01, ppo_gae_lambda=0.95)
    batch = rollout_batch([5], PROMPT, [1.0])
    batch = replace(batch, logprobs=batch.loss_mask.float())  # +1 on the two completion tokens
    strategy.critic = fixed_critic(torch.zeros(1, 5))
    monkeypatch.setattr(
        strategy.reference, "logprobs", lambda batch: torch.zeros(batch.input_ids.shape)
    )
    pinned = prepared(strategy, batch)
    a3 = -0.01 + 1.0
    a2 = -0.01 + 0.95 * a3
    torch.testing.assert_close(
        pinned.advantages, torch.tensor([[0.0, 0.0, a2, a3, 0.0]]), atol=1e-6, rtol=0
    )


def backward_on_a_rollout(strategy) -> list[torch.Tensor]:
    """Backpropagate the loss of one prepared rollout; the critic's weights before any step."""
    loss, _ = loss_of(strategy, prepared(strategy))
    loss.backward()
    return [p.detach().clone() for p in strategy.critic_component.parameters]


def test_the_critic_is_a_trained_component_of_its_own():
    strategy = ppo(critic_lr=3e-3, critic_max_grad_norm=0.5)
    (critic,) = strategy.trained_components()
    assert critic.module is strategy.critic and critic.prefix == "critic"
    assert critic.lr == 3e-3 and critic.max_grad_norm == 0.5 and critic.checkpoint_dir == "critic"
    assert {id(p) for p in critic.parameters} == {id(p) for p in strategy.critic.parameters()}


def test_critic_step_updates_the_critic_and_clears_its_gradients():
    strategy = ppo()
    before = backward_on_a_rollout(strategy)
    strategy.critic_component.step()
    critic = strategy.critic_component.parameters
    assert any(not torch.equal(p, b) for p, b in zip(critic, before))
    assert all(p.grad is None for p in strategy.critic.parameters())


@pytest.mark.parametrize("max_norm", [1e-3, 0.0])
def test_critic_gradient_is_clipped_to_its_own_norm(max_norm):
    """Under SGD with lr 1 the critic moves by exactly its (clipped) gradient."""
    strategy = ppo(critic_max_grad_norm=max_norm)
    component = strategy.critic_component
    component.optimizer = torch.optim.SGD(component.parameters, lr=1.0)
    before = backward_on_a_rollout(strategy)
    grads = [p.grad.detach().clone() for p in component.parameters]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert norm > 1e-2  # so that a 1e-3 cap really clips
    assert component.step() == pytest.approx(float(norm), rel=1e-6)  # the norm before clipping
    moved = [b - p.detach() for p, b in zip(component.parameters, before)]
    moved_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(m) for m in moved]))
    expected = max_norm if max_norm else float(norm)  # 0 = no clipping
    assert float(moved_norm) == pytest.approx(expected, rel=1e-4)


def test_a_skipped_step_drops_the_critic_gradients_too():
    """A non-finite loss skips the update of every component: the critic keeps its
    weights and loses its gradients, like the policy."""
    from ardea.model import Precision
    from ardea.trainer.distributed import Distributed
    from ardea.trainer.step.updates import Updater

    strategy = ppo()
    cpu = torch.device("cpu")
    updater = Updater(
        strategy.policy, strategy, strategy.config,
        Precision.resolve("float32", cpu, torch.float32), Distributed("none", cpu, 60.0),
    )  # fmt: skip
    before = backward_on_a_rollout(strategy)
    metrics, applied = updater._optimizer_step(float("nan"))
    assert not applied and "critic/grad_norm" not in metrics
    assert all(p.grad is None for p in strategy.critic.parameters())
    assert all(torch.equal(p, b) for p, b in zip(strategy.critic_component.parameters, before))
    assert updater.nonfinite == {"consecutive": 1, "total": 1}


def test_micro_batches_sum_to_the_whole_step():
    strategy = ppo()
    pinned = prepared(strategy)
    whole, grads_whole = run_step(strategy, [pinned])
    halves = [pinned.select(torch.arange(2)), pinned.select(torch.arange(2, 4))]
    split, grads_split = run_step(strategy, halves)
    rows, span = pinned.input_ids.shape
    terms = decoder_gradient_terms(strategy.policy.config, rows=rows, span=span)
    assert split["train/loss"] == pytest.approx(
        whole["train/loss"], rel=gamma(terms), abs=gamma(terms)
    )
    assert_gradients_close(grads_whole, grads_split, terms=terms)


def test_rollout_metrics_explained_variance_by_hand():
    strategy = ppo(ppo_kl_ctl=0.0, ppo_gae_lambda=1.0)
    batch = rollout_batch([5, 5], PROMPT, [1.0, 0.0])
    values = torch.tensor([[0, 0, 0.5, 0.5, 0], [0, 0, 0.25, 0.25, 0]], dtype=torch.float32)
    strategy.critic = fixed_critic(values)
    metrics = {}
    strategy.pin(strategy.scorers.pin(batch, metrics), metrics)
    # gamma = lambda = 1: returns = outcome [1, 1, 0, 0] on the completion tokens, values
    # [0.5, 0.5, 0.25, 0.25]; residuals [0.5, 0.5, -0.25, -0.25] have mean 0.125 and variance
    # 0.140625, the returns variance 0.25: 1 - 0.140625 / 0.25 = 0.4375
    assert metrics["critic/explained_variance"] == pytest.approx(0.4375, abs=1e-6)
    assert metrics["critic/value_mean"] == pytest.approx(0.375, abs=1e-6)
    assert metrics["critic/return_mean"] == pytest.approx(0.5, abs=1e-6)


def test_turn_level_gae_on_a_single_turn_by_hand():
    """One assistant turn: one GAE step, A = R - V(first completion token) on every token."""
    strategy = ppo(ppo_kl_ctl=0.0, ppo_gae_timestep_unit="turn")
    batch = rollout_batch([6], PROMPT, [2.0])
    values = torch.tensor([[0.0, 0.0, 0.1, 0.2, 0.3, 0.0]])
    strategy.critic = fixed_critic(values)
    pinned = prepared(strategy, batch)
    expected = torch.tensor([[0.0, 0.0, 1.9, 1.9, 1.9, 0.0]])
    torch.testing.assert_close(pinned.advantages, expected, atol=1e-6, rtol=0)
    returns = torch.tensor([[0.0, 0.0, 2.0, 2.0, 2.0, 0.0]])  # A + V_turn on its tokens
    torch.testing.assert_close(pinned.returns * pinned.action_mask, returns)


def test_adaptive_lambda_from_a_dotted_path_by_hand():
    """VAPO lambda = 1 - 1 / (alpha * L) with alpha 0.5 and L = 4 completion tokens: 0.5."""
    strategy = ppo(
        ppo_kl_ctl=0.0,
        ppo_gae_lambda="ardea.algo.lambda_fn.vapo_length_adaptive_gae",
        ppo_gae_lambda_kwargs={"alpha": 0.5},
    )
    batch = rollout_batch([7], PROMPT, [1.0])
    values = torch.tensor([[0.0, 0.0, 0.4, 0.3, 0.2, 0.1, 0.0]])
    strategy.critic = fixed_critic(values)
    pinned = prepared(strategy, batch)
    lam = 1 - 1 / (0.5 * 4)
    a5 = 1.0 - 0.1
    a4 = (0.1 - 0.2) + lam * a5
    a3 = (0.2 - 0.3) + lam * a4
    a2 = (0.3 - 0.4) + lam * a3
    expected = torch.tensor([[0.0, 0.0, a2, a3, a4, a5, 0.0]])
    torch.testing.assert_close(pinned.advantages, expected, atol=1e-6, rtol=0)


def value_loss_case(strategy, bias: float):
    """A prepared rollout whose critic predicts ``bias`` everywhere (zero head weight), with
    rollout-time values 0 and returns 1.0 / -0.5 / 0.35 / 2.0 on rows 0..3."""
    pinned = prepared(strategy)
    mask = pinned.action_mask
    returns = torch.tensor([1.0, -0.5, 0.35, 2.0])[:, None].expand_as(mask)
    pinned = pinned.pin(
        returns=torch.where(mask, returns, 0.0), old_values=torch.zeros_like(pinned.old_values)
    )
    with torch.no_grad():
        strategy.critic.value_head.weight.zero_()
        strategy.critic.value_head.bias.fill_(bias)
    return pinned


@pytest.mark.parametrize("vf_coef", [0.5, 2.0])
@pytest.mark.parametrize("value_eps_clip", [0.2, None])
def test_value_loss_term_by_hand(vf_coef, value_eps_clip):
    """V' = 0.4 everywhere, V_old = 0, clip 0.2 (V' clipped to 0.2) or none, token mean over
    the 4 + 6 + 3 + 5 completion tokens of rows with returns R = 1, -0.5, 0.35, 2:

    row  (V' - R)^2   (clip(V') - R)^2   max (clipped)   d/dV' (clipped)
    0    0.36         0.64               0.64            0 (the clipped term is constant)
    1    0.81         0.49               0.81            0.9
    2    0.0025       0.0225             0.0225          0
    3    2.56         3.24               3.24            0

    loss = vf_coef * 0.5 * mean, and the critic's head bias gets vf_coef * mean of d/dV'.
    """
    strategy = ppo(vf_coef=vf_coef, ppo_value_eps_clip=value_eps_clip)
    pinned = value_loss_case(strategy, bias=0.4)
    tokens = [4, 6, 3, 5]
    if value_eps_clip is None:
        squared, slopes = [0.36, 0.81, 0.0025, 2.56], [-0.6, 0.9, 0.05, -1.6]
    else:
        squared, slopes = [0.64, 0.81, 0.0225, 3.24], [0.0, 0.9, 0.0, 0.0]
    value_loss = 0.5 * sum(n * s for n, s in zip(tokens, squared)) / sum(tokens)
    bias_grad = vf_coef * sum(n * s for n, s in zip(tokens, slopes)) / sum(tokens)
    loss, metrics = loss_of(strategy, pinned)
    assert metrics["loss/value"] == pytest.approx(value_loss, rel=1e-5)
    assert float(loss.detach()) - metrics["loss/policy"] == pytest.approx(
        vf_coef * value_loss, rel=1e-5
    )
    loss.backward()
    assert float(strategy.critic.value_head.bias.grad) == pytest.approx(bias_grad, rel=1e-5)
    clipped_rows = 0 if value_eps_clip is None else 4 + 3 + 5
    assert metrics["loss/value_clip_frac"] == pytest.approx(clipped_rows / 18, abs=1e-6)
