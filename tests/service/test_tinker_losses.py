"""What the Tinker API server reads of a request's loss: the options from loss_fn_config
(the thresholds as the policy losses' clip ranges) and each datum's inputs."""

import pytest
import torch

from ardea.service.tinker_losses import check_datum, datum_inputs, loss_options
from ardea.service.tinker_wire import WireError


def test_thresholds_are_the_clip_ranges():
    # clip_low_threshold lo and clip_high_threshold hi: eps_clip = 1 - lo, eps_high = hi - 1
    assert loss_options("ppo", {}) == {"eps_clip": 1 - 0.8, "eps_clip_higher": 1.2 - 1}
    assert loss_options("gspo", {"clip_high_threshold": 1.5}) == {
        "eps_clip": 1 - 0.8, "eps_clip_higher": 1.5 - 1}  # fmt: skip
    assert loss_options("cispo", {"clip_low_threshold": 0.0}) == {
        "eps_clip": 1.0, "eps_clip_higher": 1.2 - 1}  # fmt: skip
    assert loss_options("dro", {"beta": 0.5}) == {"beta": 0.5}
    assert loss_options("cross_entropy", {}) == loss_options("importance_sampling", {}) == {}


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        ("dro", {}, "needs loss_fn_config {'beta'"),
        ("dro", {"beta": -1.0}, "beta must be"),
        ("ppo", {"clip_low_threshold": 1.1}, "clip_low_threshold < 1"),
        ("cispo", {"clip_high_threshold": 0.9}, "1 < clip_high_threshold"),
        ("ppo", {"clip_low_threshold": 0.0}, "ppo needs clip_low_threshold > 0"),
        ("gspo", {"clip_low_threshold": 0.0}, "gspo needs clip_low_threshold > 0"),
        ("ppo", {"clip_high_threshold": "wide"}, r"\['clip_high_threshold'\]='wide' must be"),
    ],
)
def test_bad_config_is_named(name, config, message):
    with pytest.raises(WireError, match=message):
        loss_options(name, config)


def test_a_datum_reads_its_loss_inputs():
    logprobs = torch.tensor([-1.0, -2.0, -0.5])
    row = {"weights": torch.tensor([0.0, 1.0, 1.0])}
    inputs = datum_inputs("cross_entropy", logprobs, row)
    assert inputs.logprobs.shape == (1, 3) and inputs.agg.mode == "none"
    torch.testing.assert_close(inputs.advantages, row["weights"][None])
    assert bool(inputs.loss_mask.all()) and inputs.ratio_mask is None
    row = {"logprobs": torch.zeros(3), "advantages": torch.ones(3),
           "sequence_ratio_mask": torch.tensor([0.0, 1.0, 1.0])}  # fmt: skip
    inputs = datum_inputs("gspo", logprobs, row)
    assert inputs.ratio_mask.tolist() == [[False, True, True]]
    torch.testing.assert_close(inputs.old_logprobs, row["logprobs"][None])
    with pytest.raises(WireError, match=r"data\[2\].*'sequence_ratio_mask'\] marks no token"):
        check_datum("gspo", {**row, "sequence_ratio_mask": torch.zeros(3)}, 2)
