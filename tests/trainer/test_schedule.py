"""Learning-rate multipliers against hand-computed values."""

import math

import pytest
import torch

from ardea.trainer.schedule import build_scheduler, lr_multiplier


def test_warmup_is_linear_from_one_over_warmup():
    assert [
        lr_multiplier(s, kind="cosine", warmup_steps=4, total_steps=10, min_ratio=0.0)
        for s in range(4)
    ] == [
        0.25,
        0.5,
        0.75,
        1.0,
    ]


def test_cosine_and_linear_values():
    # warmup 2, total 12: progress p = (step - 2) / 10
    cos = lr_multiplier(7, kind="cosine", warmup_steps=2, total_steps=12, min_ratio=0.1)
    assert cos == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_multiplier(
        12, kind="cosine", warmup_steps=2, total_steps=12, min_ratio=0.1
    ) == pytest.approx(0.1)
    assert lr_multiplier(
        4, kind="linear", warmup_steps=2, total_steps=12, min_ratio=0.0
    ) == pytest.approx(0.8)
    assert lr_multiplier(9, kind="constant", warmup_steps=2, total_steps=12, min_ratio=0.0) == 1.0


def test_scheduler_applies_multiplier():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=2.0)
    sched = build_scheduler(opt, kind="linear", warmup_steps=0, total_steps=4, min_ratio=0.0)
    seen = []
    for _ in range(4):
        seen.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert seen == pytest.approx([2.0, 1.5, 1.0, 0.5])
