"""``dpo``: the loss on known log-probs is -log sigmoid(beta * margin), IPO, reductions,
one concatenated policy forward, and a frozen reference that backward never touches."""

import math

import pytest
import torch
import torch.nn.functional as F
from strategy_testing import PAD, build, naive_logprobs, pad_rows, random_rows, tiny_policy

from ardea.data import TrajectoryBatch
from ardea.errors import ConfigError
from ardea.trainer.step.updates import read_metrics
from ardea.trainer.strategies import make_strategy

PROMPT = [3, 5]  # prompt lengths of the two pairs


def preference_batch(seed: int = 2) -> TrajectoryBatch:
    """Two pairs in the preference layout (chosen rows, then rejected rows); chosen and
    rejected share the prompt, responses differ in length."""
    chosen = random_rows([8, 6], seed)
    rejected = random_rows([5, 9], seed + 1)
    for c, r, p in zip(chosen, rejected, PROMPT):
        r[:p] = c[:p]
    rows = chosen + rejected
    prompts = PROMPT + PROMPT
    return TrajectoryBatch.from_tensors(
        pad_rows(rows, PAD),
        pad_rows([[1] * len(r) for r in rows]),
        pad_rows([[0] * p + [1] * (len(r) - p) for r, p in zip(rows, prompts)]).bool(),
        rewards=torch.tensor([1.0, 1.0, 0.0, 0.0]),
        group_ids=torch.tensor([0, 1, 0, 1]),
    )


def naive_sequence_logps(model, batch, side: str, reduction: str) -> torch.Tensor:
    rows = slice(0, 2) if side == "chosen" else slice(2, 4)
    ids, attn = batch.input_ids[rows], batch.attention_mask[rows]
    response = batch.loss_mask[rows, 1:].double()  # token t+1 is a response token
    total = (naive_logprobs(model, ids, attn) * response).sum(-1)
    return total / response.sum(-1) if reduction == "mean" else total


def step_loss(strategy, batch):
    loss, metrics = strategy.loss(batch, strategy.step_counts([batch]))
    return loss, read_metrics(metrics)  # as the trainer reads them


@pytest.mark.parametrize("kind", ["sigmoid", "ipo"])
def test_identical_policy_and_reference(kind):
    """Margin 0: DPO loss log 2, IPO loss (1 / (2 beta))^2; rewards 0, accuracy 0."""
    strategy = build("dpo", tiny_policy(), beta=0.1, dpo_loss=kind)
    loss, metrics = step_loss(strategy, preference_batch())
    expected = math.log(2.0) if kind == "sigmoid" else (1 / (2 * 0.1)) ** 2
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    for name in ("reward_chosen", "reward_rejected", "reward_margin", "reward_accuracy"):
        assert metrics[f"train/{name}"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("kind", ["sigmoid", "ipo"])
def test_loss_on_known_logprobs(reduction, kind):
    policy, reference = tiny_policy(seed=0), tiny_policy(seed=7)
    beta = 0.5
    strategy = build(
        "dpo", policy, reference=reference, beta=beta, dpo_loss=kind, dpo_reduction=reduction
    )
    batch = preference_batch()
    loss, metrics = step_loss(strategy, batch)
    with torch.no_grad():
        pc, pr = (naive_sequence_logps(policy, batch, s, reduction) for s in ("chosen", "rejected"))
        rc, rr = (
            naive_sequence_logps(reference, batch, s, reduction) for s in ("chosen", "rejected")
        )
    margin = (pc - rc) - (pr - rr)  # (2,)
    if kind == "sigmoid":
        expected = -F.logsigmoid(beta * margin).mean()
    else:
        expected = ((margin - 1 / (2 * beta)) ** 2).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    assert metrics[f"train/{'dpo' if kind == 'sigmoid' else 'ipo'}_loss"] == pytest.approx(
        expected.item(), rel=1e-5, abs=1e-6
    )
    assert metrics["train/loss"] == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    # differences of float32 sums of ~-30: compare to a few float32 ulps of the sums
    assert metrics["train/reward_chosen"] == pytest.approx(
        (beta * (pc - rc)).mean().item(), abs=5e-6
    )
    assert metrics["train/reward_margin"] == pytest.approx((beta * margin).mean().item(), abs=5e-6)
    accuracy = (margin > 0).double().mean().item()
    assert metrics["train/reward_accuracy"] == pytest.approx(accuracy)
    assert metrics["train/logps_chosen"] == pytest.approx(pc.mean().item(), rel=1e-5)
    assert metrics["train/logps_rejected"] == pytest.approx(pr.mean().item(), rel=1e-5)


def test_one_concatenated_policy_forward():
    policy = tiny_policy()
    strategy = build("dpo", policy)
    rows = []
    hook = policy.model.register_forward_hook(
        lambda m, args, kw, out: rows.append(kw), with_kwargs=True
    )
    try:
        step_loss(strategy, preference_batch())
    finally:
        hook.remove()
    assert [kw["input_ids"].shape[0] for kw in rows] == [4]  # 2 chosen + 2 rejected, once


def test_reference_is_frozen_and_untouched():
    policy = tiny_policy()
    strategy = build("dpo", policy, reference=tiny_policy(seed=3))
    reference = strategy.reference.model
    assert not reference.training
    assert not any(p.requires_grad for p in reference.parameters())
    before = {n: p.clone() for n, p in reference.named_parameters()}
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    loss, _ = step_loss(strategy, preference_batch())
    loss.backward()
    optimizer.step()
    assert all(p.grad is None for p in reference.parameters())
    assert all(torch.equal(p, before[n]) for n, p in reference.named_parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())


def test_missing_reference_factory_is_an_error():
    from strategy_testing import TOKENIZER, make_config

    with pytest.raises(ConfigError, match="'dpo' needs a copy of the initial policy"):
        make_strategy("dpo", tiny_policy(), make_config("dpo"), tokenizer=TOKENIZER)


@pytest.mark.parametrize("rows", [[0, 1, 2], [0, 1, 3, 2]], ids=["odd", "unpaired"])
def test_a_batch_outside_the_preference_layout_is_refused(rows):
    batch = preference_batch().select(torch.tensor(rows))
    with pytest.raises(ValueError, match="chosen rows then rejected rows"):
        step_loss(build("dpo", tiny_policy()), batch)
