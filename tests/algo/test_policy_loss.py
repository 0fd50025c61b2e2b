"""PPO (clip-higher, dual-clip), decoupled PPO and GSPO losses; the registry's resolution."""

import dataclasses
import math

import pytest
import torch

from ardea.algo import (
    POLICY_LOSSES,
    POLICY_OPTIONS,
    Aggregation,
    PolicyLossInputs,
    decoupled_ppo,
    get_policy_loss,
    gspo,
    ppo,
    register_policy_loss,
)
from ardea.errors import ConfigError

# ratios 1.5, 0.5, 1.1, 0.5, 4.0 against advantages +1, +1, -1, -1, -1
RATIOS = torch.tensor([[1.5, 0.5, 1.1, 0.5, 4.0]], dtype=torch.float64)
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
OLD = torch.zeros(1, 5, dtype=torch.float64)
MASK = torch.ones(1, 5, dtype=torch.bool)


def inputs(logprobs, old=OLD, adv=ADV, mask=MASK, **fields) -> PolicyLossInputs:
    return PolicyLossInputs(logprobs, old, adv, mask, **fields)


def test_symmetric_clip_by_hand():
    loss, metrics = ppo(inputs(RATIOS.log()), eps_clip=0.2)
    # per token: -min(rA, clip(r)A): -1.2, -0.5, 1.1, 0.8, 4.0
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.1 + 0.8 + 4.0) / 5)
    assert float(metrics["loss/clip_frac"]) == pytest.approx(2 / 5)  # tokens 0 and 3
    assert float(metrics["loss/dual_clip_frac"]) == 0.0
    kl = [r - 1 - math.log(r) for r in RATIOS[0].tolist()]
    assert float(metrics["loss/approx_kl"]) == pytest.approx(sum(kl) / 5)
    assert float(metrics["loss/policy"]) == pytest.approx(loss.item())


def test_clip_higher_and_dual_clip_by_hand():
    loss, metrics = ppo(inputs(RATIOS.log()), eps_clip=0.2, eps_clip_higher=0.6, c_clip=3.0)
    # token 0 no longer clipped (1.5 < 1.6); token 4's loss 4.0 is bounded by c = 3
    assert loss.item() == pytest.approx((-1.5 - 0.5 + 1.1 + 0.8 + 3.0) / 5)
    assert float(metrics["loss/clip_frac"]) == pytest.approx(1 / 5)
    assert float(metrics["loss/dual_clip_frac"]) == pytest.approx(1 / 5)


def test_matches_the_seed_grpo_surrogate():
    # seed 002: -min(r A, clip(r, 0.8, 1.2) A), masked sum over clamp(count, 1)
    gen = torch.Generator().manual_seed(0)
    logp, old = -torch.rand(4, 6, generator=gen), -torch.rand(4, 6, generator=gen)
    adv = torch.randn(4, 1, generator=gen).expand(4, 6)
    mask = torch.rand(4, 6, generator=gen) > 0.3
    ratio = torch.exp(logp - old)
    per_token = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    seed = (per_token * mask).sum() / mask.sum().clamp(min=1)
    loss, _ = ppo(inputs(logp, old, adv, mask), eps_clip=0.2)
    torch.testing.assert_close(loss, seed)


def test_gradient_vanishes_only_where_clipped():
    logp = RATIOS.log().clone().requires_grad_(True)
    loss, _ = ppo(inputs(logp), eps_clip=0.2, c_clip=3.0)
    loss.backward()
    # d/dlogp of -A r = -A r / 5 for unclipped tokens 1 and 2; 0 for clipped 0, 3, dual-clipped 4
    expected = torch.tensor([[0.0, -0.5 / 5, 1.1 / 5, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected)


def test_zero_advantages_and_empty_masks_give_zero_loss_without_nan():
    logp = torch.randn(3, 4, requires_grad=True)
    loss, _ = ppo(inputs(logp, torch.randn(3, 4), torch.zeros(3, 4), torch.ones(3, 4)))
    assert loss.item() == 0.0
    for mask in (torch.zeros(3, 4), torch.zeros(0, 4)):
        rows = mask.shape[0]
        logp = torch.randn(rows, 4, requires_grad=True)
        loss, metrics = ppo(inputs(logp, torch.randn(rows, 4), torch.randn(rows, 4), mask))
        loss.backward()
        assert loss.item() == 0.0
        assert all(math.isfinite(float(v)) for v in metrics.values())
        assert bool(torch.isfinite(logp.grad).all())


def test_huge_log_ratio_at_masked_tokens_does_not_leak():
    logp = torch.tensor([[0.0, 1e4]])
    loss, _ = ppo(inputs(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[1, 0]])))
    assert loss.item() == -1.0


def test_decoupled_ppo_weights_by_behaviour_ratio_and_caps():
    prox = torch.zeros(1, 3, dtype=torch.float64)
    behav = torch.tensor(
        [[0.0, -math.log(2.0), -math.log(10.0)]], dtype=torch.float64
    )  # w = 1, 2, 10
    logp = torch.zeros(1, 3, dtype=torch.float64)
    adv = torch.ones(1, 3, dtype=torch.float64)
    mask = torch.ones(1, 3)
    loss, metrics = decoupled_ppo(
        inputs(logp, prox, adv, mask, behav_logprobs=behav), behav_imp_weight_cap=5.0
    )
    # r = 1 against prox: per token -1, weighted 1, 2, dropped; normalized by all 3 tokens
    assert loss.item() == pytest.approx(-3.0 / 3)
    assert float(metrics["loss/behav_drop_frac"]) == pytest.approx(1 / 3)
    assert float(metrics["loss/behav_imp_weight"]) == pytest.approx(3 / 3)
    uncapped, _ = decoupled_ppo(inputs(logp, prox, adv, mask, behav_logprobs=behav))
    assert uncapped.item() == pytest.approx(-13.0 / 3)
    same, _ = ppo(inputs(logp, prox, adv, mask))
    on_policy, _ = decoupled_ppo(inputs(logp, prox, adv, mask, behav_logprobs=prox))
    torch.testing.assert_close(same, on_policy)


def test_gspo_uses_the_length_normalized_sequence_ratio():
    old = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.tensor([[0.3, 0.0, 0.0], [0.1, 0.1, 9.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    agg = Aggregation("seq-mean-token-mean")
    loss, metrics = gspo(inputs(logp, old, adv, mask, agg=agg), eps_clip=0.2, eps_clip_higher=0.2)
    s0, s1 = math.exp(0.1), math.exp(0.1)  # mean log-ratio 0.3/3 and 0.2/2
    # seq-mean-token-mean: row 0 -min(s0, 1.2)=-s0, row 1 -min(-s1, -1.2)... = s1 (unclipped)
    assert loss.item() == pytest.approx((-s0 + s1) / 2)
    assert float(metrics["loss/clip_frac"]) == 0.0
    loss.backward()
    # every token of a row gets the sequence ratio's value times its own gradient
    expected = torch.tensor([[-s0 / 3] * 3, [s1 / 2, s1 / 2, 0.0]], dtype=torch.float64) / 2
    torch.testing.assert_close(logp.grad, expected)


def test_registry_entries_are_the_formulas_with_one_signature():
    """Each entry of POLICY_LOSSES is the formula itself; the decorator recorded its options
    and whether it needs a proximal policy, once, on the function."""
    assert set(POLICY_LOSSES) == {"ppo", "decoupled_ppo", "gspo", "cross_entropy",
                                  "importance_sampling", "cispo", "dro"}  # fmt: skip
    assert POLICY_LOSSES.get("ppo") is ppo and get_policy_loss("ppo").fn is ppo
    assert get_policy_loss("gspo").options == ("eps_clip", "eps_clip_higher")
    assert get_policy_loss("dro").options == ("beta",)
    decoupled = get_policy_loss("decoupled_ppo")
    assert decoupled.needs_proximal and not get_policy_loss("ppo").needs_proximal
    same = inputs(RATIOS.log())
    options = dict(eps_clip=0.2, eps_clip_higher=0.28)
    for name in ("ppo", "gspo", "cispo"):
        loss, metrics = get_policy_loss(name).fn(same, **options)
        assert loss.dim() == 0 and "loss/policy" in metrics
    # behaviour == proximal: the weight is 1 and decoupled PPO is PPO
    loss, metrics = decoupled.fn(dataclasses.replace(same, behav_logprobs=OLD), **options)
    torch.testing.assert_close(loss, ppo(same, **options)[0])
    assert float(metrics["loss/behav_imp_weight"]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="needs behav_logprobs"):
        decoupled.fn(same)
    with pytest.raises(TypeError, match="unexpected keyword argument 'c_clip'"):
        gspo(same, c_clip=3.0)
    with pytest.raises(
        ConfigError,
        match="unknown policy loss 'ppo2'; known policy losses: cispo, cross_entropy, "
        "decoupled_ppo, dro, gspo, importance_sampling, ppo",
    ):
        get_policy_loss("ppo2")


def test_the_decorator_refuses_an_option_the_formula_does_not_take():
    def mine(inputs, *, eps_clip=0.2):
        return inputs.logprobs.sum(), {}

    with pytest.raises(ValueError, match=r"'mine' declares options \['kl_coef'\] it does not"):
        register_policy_loss("mine", options=("eps_clip", "kl_coef"))(mine)
    assert "mine" not in POLICY_LOSSES
    try:
        assert register_policy_loss("mine", options=("eps_clip",))(mine) is mine
        assert get_policy_loss("mine").options == ("eps_clip",)
    finally:
        POLICY_LOSSES.unregister("mine")


def test_a_function_by_dotted_path_takes_every_option(tmp_path, monkeypatch):
    """A user's plain function named by dotted path gets every algo.ppo policy option and
    no proximal policy."""
    (tmp_path / "my_losses.py").write_text(
        "def mean_advantage(inputs, **options):\n"
        "    mask = inputs.loss_mask.bool()\n"
        "    return -inputs.advantages[mask].mean(), {'loss/options': len(options)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    loss = get_policy_loss("my_losses.mean_advantage")
    assert loss.options == POLICY_OPTIONS and not loss.needs_proximal
    value, metrics = loss.fn(inputs(RATIOS.log()), eps_clip=0.2, c_clip=3.0)
    assert value.item() == pytest.approx(0.2)  # advantages +1 +1 -1 -1 -1
    assert metrics == {"loss/options": 2}


@pytest.mark.parametrize(
    ("fields", "options", "message"),
    [
        (dict(old=torch.zeros(1, 4, dtype=torch.float64)), {}, "shape"),
        (dict(old=torch.full((1, 5), float("nan"), dtype=torch.float64)), {}, "only finite"),
        ({}, dict(eps_clip=0.0), "eps_clip"),
        ({}, dict(c_clip=1.0), "c_clip"),
    ],
)
def test_bad_input_is_named(fields, options, message):
    with pytest.raises(ValueError, match=message):
        ppo(inputs(RATIOS.log(), **fields), **options)


def test_trusted_inputs_skip_only_the_value_checks():
    """Inside trusted_inputs() a NaN is not looked for (that read is a device sync: the
    loss comes out NaN instead, which the trainer counts and skips), but a wrong shape is
    still refused; outside, both are, and the flag is restored after the block."""
    from ardea.algo import trusted_inputs

    nan = inputs(RATIOS.log(), torch.full((1, 5), float("nan"), dtype=torch.float64))
    with trusted_inputs():
        loss, _ = ppo(nan)
        assert math.isnan(float(loss))
        with pytest.raises(ValueError, match="shape"):
            ppo(dataclasses.replace(nan, old_logprobs=torch.zeros(1, 4, dtype=torch.float64)))
    with pytest.raises(ValueError, match="only finite values"):
        ppo(nan)
