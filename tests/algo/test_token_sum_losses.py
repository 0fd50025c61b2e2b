"""The Tinker API's losses against hand-computed numbers.

One datum of two tokens: ``logprobs = [-1.0, -2.0]``, sampler log-probs
``q = [-1.2, -2.1]``, advantages ``A = [1.0, -0.5]``, so ``r = exp(lp - q) =
[e^0.2, e^0.1] = [1.2214027582, 1.1051709181]``. Token 0's ratio is above the 1.2 clip,
token 1's inside it. Each case gives the elementwise loss and ``d(sum)/d(logprobs)``:

- cross_entropy, weights [1, 0.5]: loss [1, 1]; grad [-1, -0.5];
- importance_sampling: -rA = [-1.2214027582, 0.5525854590]; grad = -rA;
- ppo: token 0 clipped: -min(1.2214, 1.2) = -1.2, grad 0; token 1: -rA = 0.5525854590,
  grad 0.5525854590;
- cispo: w = clip(r) = [1.2, 1.1051709181] (constant); loss -w lp A = [1.2, -1.1051709181];
  grad -w A = [-1.2, 0.5525854590];
- dro, beta 0.5: -(lp A - 0.25 (lp - q)^2) = [1.01, -0.9975]; grad -(A - 0.5 (lp - q)) =
  [-0.9, 0.55].
"""

import pytest
import torch

from ardea.algo.token_sum_losses import TOKEN_SUM_LOSSES

LP = [-1.0, -2.0]
INPUTS = {
    "logprobs": torch.tensor([-1.2, -2.1], dtype=torch.float64),
    "advantages": torch.tensor([1.0, -0.5], dtype=torch.float64),
    "weights": torch.tensor([1.0, 0.5], dtype=torch.float64),
}
CASES = {
    "cross_entropy": ({}, [1.0, 1.0], [-1.0, -0.5]),
    "importance_sampling": ({}, [-1.2214027582, 0.5525854590], [-1.2214027582, 0.5525854590]),
    "ppo": ({}, [-1.2, 0.5525854590], [0.0, 0.5525854590]),
    "cispo": ({}, [1.2, -1.1051709181], [-1.2, 0.5525854590]),
    "dro": ({"beta": 0.5}, [1.01, -0.9975], [-0.9, 0.55]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_and_gradient_by_hand(name):
    config, loss, grad = CASES[name]
    logprobs = torch.tensor(LP, dtype=torch.float64, requires_grad=True)
    elementwise = TOKEN_SUM_LOSSES[name][0](logprobs, INPUTS, config)
    elementwise.sum().backward()
    torch.testing.assert_close(elementwise.detach(), torch.tensor(loss, dtype=torch.float64),
                               rtol=0, atol=1e-9)  # fmt: skip
    torch.testing.assert_close(logprobs.grad, torch.tensor(grad, dtype=torch.float64),
                               rtol=0, atol=1e-9)  # fmt: skip


def test_custom_thresholds_move_the_clip():
    """With clip_high 1.25 token 0 (r = 1.2214) is inside the clip: ppo's loss is -rA."""
    logprobs = torch.tensor(LP, dtype=torch.float64)
    loss = TOKEN_SUM_LOSSES["ppo"][0](logprobs, INPUTS, {"clip_high_threshold": 1.25})
    assert loss[0].item() == pytest.approx(-1.2214027582, abs=1e-9)
    cispo = TOKEN_SUM_LOSSES["cispo"][0](logprobs, INPUTS, {"clip_low_threshold": 0.5,
                                                              "clip_high_threshold": 1.1})  # fmt: skip
    # w = clip(r, 0.5, 1.1) = [1.1, 1.1]: loss = -1.1 * lp * A = [1.1, -1.1]
    torch.testing.assert_close(cispo, torch.tensor([1.1, -1.1], dtype=torch.float64))


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        ("dro", {}, "needs loss_fn_config {'beta'"),
        ("dro", {"beta": -1.0}, "beta must be"),
        ("ppo", {"clip_low_threshold": 1.1}, "clip_low_threshold < 1"),
        ("cispo", {"clip_high_threshold": 0.9}, "1 < clip_high_threshold"),
        ("ppo", {"clip_low_threshold": 0.0}, "clip_low_threshold > 0"),
    ],
)
def test_bad_config_is_named(name, config, message):
    with pytest.raises(ValueError, match=message):
        TOKEN_SUM_LOSSES[name][0](torch.tensor(LP), INPUTS, config)
