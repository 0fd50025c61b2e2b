"""The Tinker API's losses, entries of POLICY_LOSSES, against hand-computed numbers.

Each runs as the Tinker API server runs it: unreduced (aggregation ``none``: the datum's
elementwise loss) and summed. One datum of two tokens: ``logprobs = [-1.0, -2.0]``, sampler
log-probs ``q = [-1.2, -2.1]``, advantages ``A = [1.0, -0.5]``, so ``r = exp(lp - q) =
[e^0.2, e^0.1] = [1.2214027582, 1.1051709181]``. Token 0's ratio is above the 1.2 clip,
token 1's inside it. The Tinker thresholds 0.8 / 1.2 are ``eps_clip = 0.2``,
``eps_clip_higher = 0.2``. Each case gives the elementwise loss and ``d(sum)/d(logprobs)``:

- cross_entropy, weights (the advantages' place) [1, 0.5]: loss [1, 1]; grad [-1, -0.5];
- importance_sampling: -rA = [-1.2214027582, 0.5525854590]; grad = -rA;
- ppo: token 0 clipped: -min(1.2214, 1.2) = -1.2, grad 0; token 1: -rA = 0.5525854590,
  grad 0.5525854590;
- cispo: w = clip(r) = [1.2, 1.1051709181] (constant); loss -w lp A = [1.2, -1.1051709181];
  grad -w A = [-1.2, 0.5525854590];
- dro, beta 0.5: -(lp A - 0.25 (lp - q)^2) = [1.01, -0.9975]; grad -(A - 0.5 (lp - q)) =
  [-0.9, 0.55].
"""

import math

import pytest
import torch

from ardea.algo import Aggregation, PolicyLossInputs, get_policy_loss

LP = [[-1.0, -2.0]]
Q = torch.tensor([[-1.2, -2.1]], dtype=torch.float64)
A = torch.tensor([[1.0, -0.5]], dtype=torch.float64)
WEIGHTS = torch.tensor([[1.0, 0.5]], dtype=torch.float64)
UNREDUCED = Aggregation("none")
TINKER = dict(eps_clip=0.2, eps_clip_higher=0.2)  # clip_low 0.8, clip_high 1.2
CASES = {
    "cross_entropy": ({}, [1.0, 1.0], [-1.0, -0.5]),
    "importance_sampling": ({}, [-1.2214027582, 0.5525854590], [-1.2214027582, 0.5525854590]),
    "ppo": (TINKER, [-1.2, 0.5525854590], [0.0, 0.5525854590]),
    "cispo": (TINKER, [1.2, -1.1051709181], [-1.2, 0.5525854590]),
    "dro": ({"beta": 0.5}, [1.01, -0.9975], [-0.9, 0.55]),
}


def run(name, logprobs, options, **fields):
    """The elementwise loss of ``name`` and ``d(sum)/d(logprobs)``."""
    logprobs = logprobs.clone().requires_grad_(True)
    fields = {"old_logprobs": Q, "advantages": A, "loss_mask": torch.ones_like(Q)} | fields
    elementwise, _ = get_policy_loss(name).fn(
        PolicyLossInputs(logprobs, **fields, agg=UNREDUCED), **options
    )
    elementwise.sum().backward()
    return elementwise.detach(), logprobs.grad


@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_and_gradient_by_hand(name):
    options, loss, grad = CASES[name]
    advantages = WEIGHTS if name == "cross_entropy" else A
    elementwise, gradient = run(name, torch.tensor(LP, dtype=torch.float64), options,
                                advantages=advantages)  # fmt: skip
    torch.testing.assert_close(elementwise, torch.tensor([loss], dtype=torch.float64),
                               rtol=0, atol=1e-9)  # fmt: skip
    torch.testing.assert_close(gradient, torch.tensor([grad], dtype=torch.float64),
                               rtol=0, atol=1e-9)  # fmt: skip


def test_custom_thresholds_move_the_clip():
    """With clip_high 1.25 (eps_clip_higher 0.25) token 0 (r = 1.2214) is inside the clip:
    ppo's loss is -rA."""
    logprobs = torch.tensor(LP, dtype=torch.float64)
    loss, _ = run("ppo", logprobs, dict(eps_clip=0.2, eps_clip_higher=0.25))
    assert loss[0, 0].item() == pytest.approx(-1.2214027582, abs=1e-9)
    # clip_low 0.5, clip_high 1.1: w = clip(r, 0.5, 1.1) = [1.1, 1.1]; loss -1.1 lp A
    cispo, _ = run("cispo", logprobs, dict(eps_clip=0.5, eps_clip_higher=0.1))
    torch.testing.assert_close(cispo, torch.tensor([[1.1, -1.1]], dtype=torch.float64))


#: GSPO: two data, the second right-padded. Row 0: log-ratios lp - q = [0.2, 0.1, 0.0], the
#: ratio mask [0, 1, 1] leaves token 0 (a prompt token, say) out of the ratio: log s =
#: (0.1 + 0.0) / 2 = 0.05. Row 1: log-ratios [-0.2, -0.3], both in: log s = -0.25.
GSPO_LP = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]], dtype=torch.float64)
GSPO_FIELDS = dict(
    old_logprobs=torch.tensor([[-1.2, -2.1, -0.5], [-0.1, -0.4, 0.0]], dtype=torch.float64),
    advantages=torch.tensor([[2.0, 1.0, -0.5], [-1.0, 2.0, 0.0]], dtype=torch.float64),
    loss_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]),
    ratio_mask=torch.tensor([[0, 1, 1], [1, 1, 0]]),
)


def test_gspo_as_the_tinker_api_defines_it_by_hand():
    """Every token takes its row's sequence ratio s (value) with its own gradient, clipped
    to [0.8, 1.2]; tokens outside the ratio mask still count in the loss.

    Row 0: s = e^0.05 = 1.0512710964, inside the clip: l = -s A = [-2s, -s, 0.5 s] =
    [-2.1025421928, -1.0512710964, 0.5256355482] and d l / d lp = -A s, the same numbers.
    Row 1: s = e^-0.25 = 0.7788007831, below 0.8: token 0 (A = -1) takes the clipped term,
    -min(-s, -0.8) = 0.8 with no gradient; token 1 (A = 2) -min(2s, 1.6) = -2s =
    -1.5576015661, gradient -2s. The padded token is 0."""
    loss, grad = run("gspo", GSPO_LP, TINKER, **GSPO_FIELDS)
    s0, s1 = math.exp(0.05), math.exp(-0.25)
    expected = [[-2 * s0, -s0, 0.5 * s0], [0.8, -2 * s1, 0.0]]
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))
    expected_grad = [[-2 * s0, -s0, 0.5 * s0], [0.0, -2 * s1, 0.0]]
    torch.testing.assert_close(grad, torch.tensor(expected_grad, dtype=torch.float64))
    assert loss.sum().item() == pytest.approx(-2.5 * s0 + 0.8 - 2 * s1)  # the request's loss


def test_gspo_tighter_thresholds_clip_the_first_row_too():
    """clip_high 1.04 (eps_clip_higher 0.04): row 0's s = 1.0513 is above it; token 0 and 1
    (A > 0) take -1.04 A with no gradient, token 2 (A < 0) keeps -s A = 0.5256355482."""
    loss, grad = run("gspo", GSPO_LP, dict(eps_clip=0.2, eps_clip_higher=0.04), **GSPO_FIELDS)
    s0 = math.exp(0.05)
    torch.testing.assert_close(loss[0], torch.tensor([-2.08, -1.04, 0.5 * s0], dtype=torch.float64))
    torch.testing.assert_close(grad[0], torch.tensor([0.0, 0.0, 0.5 * s0], dtype=torch.float64))


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("dro", {"beta": -1.0}, "beta must be"),
        ("ppo", {"eps_clip": 1.0}, r"eps_clip must lie in \(0, 1\)"),
        ("cispo", {"eps_clip": 1.5}, r"eps_clip must lie in \(0, 1\]"),
        ("cispo", {"eps_clip_higher": -0.1}, "eps_clip_higher must be a positive number"),
    ],
)
def test_bad_options_are_named(name, options, message):
    with pytest.raises(ValueError, match=message):
        run(name, torch.tensor(LP, dtype=torch.float64), options)
