"""``kto``: the loss on the policy's and the reference's summed log-probs, with the reference
point from the mismatched rows, equals the formula worked out from naive full forwards; the
policy's gradient comes from the labeled rows only; options are checked by name."""

import math

import pytest
import torch
from strategy_testing import PAD, build, naive_logprobs, tiny_policy

from ardea.config import load_config
from ardea.data import LabeledSample, collate_labeled
from ardea.errors import ConfigError
from ardea.trainer.step.updates import read_metrics

SAMPLES = [
    LabeledSample((7, 8, 9), (20, 21, 22, 23), True),
    LabeledSample((10, 11), (30, 31), False),
    LabeledSample((12, 13, 14, 15), (40, 41, 42), True),
]


def naive_sums(model, batch) -> list[float]:
    """Each row's summed log-prob of its trained tokens, full float64 forward."""
    with torch.no_grad():
        lp = naive_logprobs(model, batch.input_ids, batch.attention_mask)
    return (lp * batch.loss_mask[:, 1:].double()).sum(-1).tolist()


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_identical_policy_and_reference():
    """r = 0 and z = 0: every example loses w / 2; rewards 0."""
    strategy = build("kto", tiny_policy(), kto_desirable_weight=1.0, kto_undesirable_weight=3.0)
    batch = collate_labeled(SAMPLES, PAD)
    loss, metrics = strategy.loss(batch, strategy.step_counts([batch]))
    metrics = read_metrics(metrics)
    assert loss.item() == pytest.approx((0.5 + 1.5 + 0.5) / 3, abs=1e-6)
    assert metrics["train/kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["train/rewards_margins"] == pytest.approx(0.0, abs=1e-6)


def test_loss_on_known_logprobs():
    policy, reference = tiny_policy(seed=0), tiny_policy(seed=7)
    beta = 0.5
    strategy = build("kto", policy, reference=reference, beta=beta, kto_undesirable_weight=2.0)
    batch = collate_labeled(SAMPLES, PAD)
    loss, metrics = strategy.loss(batch, strategy.step_counts([batch]))
    metrics = read_metrics(metrics)
    pol, ref = naive_sums(policy, batch), naive_sums(reference, batch)
    z = max(0.0, sum(p - r for p, r in zip(pol[3:], ref[3:])) / 3)
    ratios = [p - r for p, r in zip(pol[:3], ref[:3])]
    per = [
        (1 - sigmoid(beta * (r - z))) if s.desirable else 2.0 * (1 - sigmoid(beta * (z - r)))
        for r, s in zip(ratios, SAMPLES)
    ]
    assert loss.item() == pytest.approx(sum(per) / 3, abs=1e-5)
    assert metrics["train/kl"] == pytest.approx(z, abs=1e-5)
    assert metrics["train/rewards_chosen"] == pytest.approx(
        beta * (ratios[0] + ratios[2]) / 2, abs=1e-5
    )
    assert metrics["train/rewards_rejected"] == pytest.approx(beta * ratios[1], abs=1e-5)
    assert metrics["train/logps_rejected"] == pytest.approx(pol[1], abs=1e-5)


def test_the_reference_point_is_the_whole_steps():
    """A step of two micro-batches (2 samples each): ``z`` is the mean log-ratio over the
    mismatched rows of both, worked out from naive forwards, in each micro-batch's loss, and
    ``train/kl`` summed over the micro-batches is that ``z``. Per micro-batch it would depend
    on how the step is cut (micro-batches, ranks)."""
    policy, reference = tiny_policy(seed=1), tiny_policy(seed=2)
    strategy = build("kto", policy, reference=reference, beta=0.5)
    four = [*SAMPLES, LabeledSample((16, 17), (50, 51, 52), False)]
    batches = [collate_labeled(four[:2], PAD), collate_labeled(four[2:], PAD)]
    counts = strategy.step_counts(batches)
    ratios = []
    for batch in batches:
        pol, ref = naive_sums(policy, batch), naive_sums(reference, batch)
        ratios += [p - r for p, r in zip(pol[2:], ref[2:])]  # the mismatched rows
    z = max(0.0, sum(ratios) / 4)
    # z > 0 (not clamped), and a z per micro-batch would differ: means 0.005 and 0.15 here
    assert z > 0 and abs(sum(ratios[:2]) - sum(ratios[2:])) / 2 > 0.1
    kls = [read_metrics(strategy.loss(b, counts)[1])["train/kl"] for b in batches]
    assert sum(kls) == pytest.approx(z, abs=1e-5)
    assert kls[0] == pytest.approx(z / 2, abs=1e-5)  # half the step's examples


def test_gradient_comes_from_the_labeled_rows():
    """The policy's gradient equals that of the formula applied to its own forward of the
    labeled rows with z held fixed: the mismatched rows' forward carries none."""
    policy, reference = tiny_policy(seed=0), tiny_policy(seed=7)
    strategy = build("kto", policy, reference=reference, beta=0.5)
    batch = collate_labeled(SAMPLES, PAD)
    loss, metrics = strategy.loss(batch, strategy.step_counts([batch]))
    loss.backward()
    got = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    z = read_metrics(metrics)["train/kl"]
    lp = naive_logprobs(policy, batch.input_ids[:3], batch.attention_mask[:3])
    sums = (lp * batch.loss_mask[:3, 1:].double()).sum(-1)
    ref = torch.tensor(naive_sums(reference, batch)[:3], dtype=torch.float64)
    x = 0.5 * (sums - ref - z)
    labels = torch.tensor([s.desirable for s in SAMPLES])
    expected = torch.where(labels, 1 - torch.sigmoid(x), 1 - torch.sigmoid(-x)).sum() / 3
    expected.backward()
    for g, p in zip(got, policy.parameters()):
        torch.testing.assert_close(g, p.grad.to(g.dtype), atol=1e-5, rtol=1e-4)


def test_options_are_checked_by_name():
    assert build("kto", tiny_policy()).beta == 0.1
    with pytest.raises(
        ConfigError, match="algo.kto_desirable_weight=2.0 is an option of algo.name=kto"
    ):
        load_config(None, ["algo.name=dpo", "algo.kto_desirable_weight=2.0"])
    with pytest.raises(ConfigError, match="algo.kto_undesirable_weight"):
        load_config(None, ["algo.name=kto", "algo.kto_undesirable_weight=0"])
    with pytest.raises(ConfigError, match="algo.dpo_loss / algo.dpo_reduction are options of dpo"):
        load_config(None, ["algo.name=kto", "algo.dpo_reduction=mean"])
