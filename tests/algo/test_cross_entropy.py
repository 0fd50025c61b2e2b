"""Masked next-token cross-entropy."""

import pytest
import torch
import torch.nn.functional as F

from ardea.algo import masked_cross_entropy


def test_matches_cross_entropy_with_ignore_index():
    # seed 002's SFT: targets masked to -100, F.cross_entropy(ignore_index=-100)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen)
    targets = torch.randint(0, 11, (2, 5), generator=gen)
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    for smoothing in (0.0, 0.1):
        seed = F.cross_entropy(
            logits.flatten(0, 1),
            targets.masked_fill(~mask, -100).flatten(),
            ignore_index=-100,
            label_smoothing=smoothing,
        )
        loss, metrics = masked_cross_entropy(logits, targets, mask, label_smoothing=smoothing)
        torch.testing.assert_close(loss, seed)
        assert float(metrics["loss/ce"]) == pytest.approx(float(seed))


def test_uniform_logits_give_log_vocab_and_padding_targets_are_ignored():
    targets = torch.tensor([[3, -100, 99]])
    loss, _ = masked_cross_entropy(torch.zeros(1, 3, 8), targets, torch.tensor([[1, 0, 0]]))
    assert loss.item() == pytest.approx(torch.log(torch.tensor(8.0)).item())
    empty, _ = masked_cross_entropy(
        torch.zeros(1, 3, 8, requires_grad=True), targets, torch.zeros(1, 3)
    )
    assert empty.item() == 0.0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"targets at counted positions must lie in \[0, V=8\)"):
        masked_cross_entropy(torch.zeros(1, 2, 8), torch.tensor([[0, 8]]), torch.ones(1, 2))
    with pytest.raises(ValueError, match="targets must have shape"):
        masked_cross_entropy(torch.zeros(1, 2, 8), torch.tensor([[0, 1, 2]]), torch.ones(1, 2))
    with pytest.raises(TypeError, match="integer token ids"):
        masked_cross_entropy(torch.zeros(1, 2, 8), torch.zeros(1, 2), torch.ones(1, 2))
