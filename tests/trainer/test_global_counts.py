"""The updater normalises a rank's losses by the step's counts summed over all ranks (one
all-reduce before the micro-batch loop; docs/howto/torchrun.md), here without a process
group: rank 0 of 2 whose all-reduce adds the other rank's counts, given by hand.

The policy's final norm is zeroed, so its logits are 0 and every token costs exactly
ln V: this rank's 4 answer tokens of the step's 10 give a loss of 4 ln V / 10 (its own
count would give 4 ln V / 4)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tiny_models import small_model

from ardea.config import ArdeaConfig
from ardea.data import TrajectoryBatch
from ardea.model import Precision, build_char_tokenizer
from ardea.trainer.distributed import Distributed
from ardea.trainer.step.updates import PhaseTimer, Updater
from ardea.trainer.strategies import make_strategy

TOKENIZER = build_char_tokenizer()
CPU = torch.device("cpu")
THIS_RANK_TOKENS, OTHER_RANK_TOKENS = 4, 6


class RankZeroOfTwo(Distributed):
    """Rank 0 of 2 without a process group: :meth:`sum` adds the other rank's ``other``
    values (a name it lacks counts 0; the names in ``maximum``: the larger), as the
    all-reduce would; ``reduced`` records what this rank passed."""

    def __init__(self, other: dict[str, float]) -> None:
        self.mode, self.rank, self.world_size = "ddp", 0, 2
        self.device, self.heartbeat, self.timeout_s = CPU, None, 60.0
        self.other, self.reduced = other, []

    def sum(self, values, *, maximum=()):
        self.reduced.append(dict(values))
        out = {}
        for name, value in values.items():
            other = float(self.other.get(name, 0.0))
            out[name] = max(float(value), other) if name in maximum else float(value) + other
        return out


def uniform_policy() -> torch.nn.Module:
    """The small model with its final norm zeroed: logits 0 at every position."""
    policy = small_model(TOKENIZER)
    with torch.no_grad():
        policy.model.norm.weight.zero_()
    return policy


def micro_batches() -> list[TrajectoryBatch]:
    """Two micro-batches of one row each: 3 prompt + 2 answer tokens, 2 + 2; 4 answer
    tokens in all (each predicted from the position before it)."""
    out = []
    for prompt, answer in ((3, 2), (2, 2)):
        ids = torch.arange(10, 10 + prompt + answer)[None]
        trained = torch.tensor([[0] * prompt + [1] * answer], dtype=torch.bool)
        out.append(TrajectoryBatch.from_tensors(ids, torch.ones_like(ids), trained))
    return out


def one_step(dist: Distributed, batches: list | None = None) -> dict[str, float]:
    """One SFT update of ``batches`` (default :func:`micro_batches`) on a fresh uniform
    policy under ``dist``."""
    policy = uniform_policy()
    config = ArdeaConfig()
    config.algo.name = "sft"
    strategy = make_strategy("sft", policy, config, tokenizer=TOKENIZER,
                             make_reference=lambda: copy.deepcopy(policy))  # fmt: skip
    precision = Precision.resolve("float32", CPU, torch.float32)
    updater = Updater(policy, strategy, config, precision, dist)
    return updater.run([batches or micro_batches()], PhaseTimer())


def test_a_rank_normalises_by_the_tokens_of_every_rank():
    vocab = small_model(TOKENIZER).config.vocab_size
    two = RankZeroOfTwo({"tokens": OTHER_RANK_TOKENS})
    metrics = one_step(two)
    total = THIS_RANK_TOKENS + OTHER_RANK_TOKENS  # 10
    assert metrics["train/loss"] == pytest.approx(THIS_RANK_TOKENS * math.log(vocab) / total)
    assert two.reduced[0] == {"tokens": THIS_RANK_TOKENS}  # its own count, all-reduced once


def test_the_gradient_is_this_ranks_share_of_the_global_token_mean():
    """Rank 0 of 2 back-propagates 2 (the world size: DDP averages) x sum / 10; one
    process alone, sum / 4: the gradient norms are in the ratio 2 x 4 / 10 = 0.8."""
    one = one_step(Distributed("none", CPU, 60.0))
    two = one_step(RankZeroOfTwo({"tokens": OTHER_RANK_TOKENS}))
    assert one["train/loss"] == pytest.approx(math.log(small_model(TOKENIZER).config.vocab_size))
    assert one["train/grad_norm"] > 0.01
    # the two backward passes do the same float32 operations on the same values, only the
    # loss scale differs (2/10 against 1/4), so the norms agree up to a few roundings per
    # operation along the path (u = 6e-8 each, a few dozen operations): 1e-5 is > 100 u,
    # while the bug (its own count: ratio 2, not 0.8) is off by 150 %
    assert two["train/grad_norm"] == pytest.approx(0.8 * one["train/grad_norm"], rel=1e-5)


def test_a_filler_runs_but_adds_nothing():
    """A rank with nothing to train in a micro-batch runs a filler (the micro-batch's first
    group, loss times zero): its tokens are not counted and its loss, metrics and gradient
    are zero, so the update is the one without it, exactly: the same sum for the loss, and
    for the gradient the filler's backward of a loss times 0 adds (±)0.0 to every entry,
    which changes no float."""
    from ardea.trainer.step.split import Filler

    def step(batches) -> tuple[dict[str, float], RankZeroOfTwo]:
        dist = RankZeroOfTwo({"tokens": OTHER_RANK_TOKENS})
        return one_step(dist, batches), dist

    first, second = micro_batches()
    plain, plain_dist = step([first])
    filled, filled_dist = step([first, Filler(second)])
    assert filled_dist.reduced[0] == plain_dist.reduced[0] == {"tokens": 2.0}
    assert filled["train/loss"] == plain["train/loss"]
    assert filled["train/grad_norm"] == plain["train/grad_norm"]
    # only fillers: the counts' names with zeros, every metric zero, no gradient
    alone, alone_dist = step([Filler(first)])
    assert alone_dist.reduced[0] == {"tokens": 0.0}
    assert alone["train/loss"] == 0.0 and alone["train/grad_norm"] == 0.0
