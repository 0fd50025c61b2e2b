"""The pure pieces of data parallelism, without a process group: the mode ``auto``
resolves to, rank shares of a batch, the config checks, and losses normalised by counts
summed over ranks (computed by hand)."""

from __future__ import annotations

import pytest
import torch

from ardea.algo import Aggregation, agg_loss
from ardea.config import load_config
from ardea.errors import ConfigError
from ardea.trainer.distributed import Distributed, auto_mode, resolve_mode
from ardea.trainer.setup import check_distributed


class FakeRanks(Distributed):
    """A :class:`Distributed` that believes it is ``rank`` of ``world_size`` (no group)."""

    def __init__(self, rank: int, world_size: int, mode: str = "fsdp2") -> None:
        self.mode, self.rank, self.world_size = mode, rank, world_size
        self.device = torch.device("cpu")


def test_auto_is_none_for_one_process_and_decided_by_the_policy_for_several(monkeypatch):
    assert resolve_mode("auto", 1) == "none"
    assert resolve_mode("auto", 4) == "auto"  # until the policy is built (auto_mode)
    with pytest.raises(ConfigError, match="trainer.distributed=none but torchrun started 2"):
        resolve_mode("none", 2)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ConfigError, match="trainer.distributed=ddp needs a torchrun launch"):
        resolve_mode("ddp", 1)


GB, GIB = 10**9, 2**30


@pytest.mark.parametrize(
    ("parameters", "memory", "mode"),
    [
        # a replica's training state is 16 bytes a parameter; DDP while it is <= memory / 8
        (900_000, 12 * GIB, "ddp"),  # the default recipe's model, 2 processes on 24 GiB
        (100_663_296, 12 * GIB, "ddp"),  # 1.5 GiB = 12 GiB / 8 exactly
        (100_663_297, 12 * GIB, "fsdp2"),
        (625_000_000, 80 * GB, "ddp"),  # 10.0 GB = 80 GB / 8 exactly
        (625_000_001, 80 * GB, "fsdp2"),  # 16 bytes over
        (7_000_000_000, 80 * GB, "fsdp2"),  # 112 GB of state
    ],
)
def test_auto_replicates_while_a_replicas_training_state_fits_an_eighth(parameters, memory, mode):
    assert auto_mode(parameters, memory) == mode


def test_rank_shares_are_contiguous_and_cover_the_batch_in_order():
    batch = [7, 3, 9, 1, 4, 8]
    shares = [FakeRanks(r, 3).share(batch) for r in range(3)]
    assert shares == [(0, [7, 3]), (2, [9, 1]), (4, [4, 8])]
    with pytest.raises(
        ConfigError, match=r"batch_size=6 must be divisible by the number of processes \(4\)"
    ):
        FakeRanks(0, 4).share(batch)


def overrides(*extra: str) -> list[str]:
    return ["trainer.batch_size=8", "data.task=arithmetic", *extra]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["trainer.batch_size=6"], "batch_size=6 does not split over 4 processes"),
        (["trainer.grad_accum_steps=4"], "a multiple of trainer.grad_accum_steps = 4"),
        (["algo.name=online_grpo", "algo.ppo_mini_batches=4"], "at least algo.ppo_mini_batches"),
    ],
)  # fmt: skip
def test_a_batch_that_does_not_split_over_the_ranks_is_a_config_error(extra, message):
    config = load_config(None, overrides(*extra))
    with pytest.raises(ConfigError, match=message):
        check_distributed(config, FakeRanks(0, 4))
    check_distributed(config, FakeRanks(0, 1, mode="none"))  # one process runs it


def test_losses_over_global_counts_add_up_to_the_whole_batch_loss():
    """Two ranks, each with two micro-batches: per-token losses l, masks m. Token-mean over
    the step is sum(m * l) / T with T the tokens of all ranks; each micro-batch divides by
    T, so the four parts sum to the whole batch's loss (computed here by hand)."""
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [0.5, 0.5, 0.5], [2.0, 0.0, 8.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 1]], dtype=torch.bool)
    tokens = 7  # counted: 2 + 1 + 3 + 1
    by_hand = (1 + 2 + 4 + 1.5 + 8) / tokens
    agg = Aggregation("token-mean", tokens=tokens)
    parts = [agg_loss(loss[i : i + 1], mask[i : i + 1], agg) for i in range(4)]
    assert float(sum(parts)) == pytest.approx(by_hand)
    seqs = 4  # seq-mean-token-mean: mean over the 4 sequences of each one's token mean
    by_hand_seq = ((1 + 2) / 2 + 4 + 1.5 / 3 + 8) / seqs
    parts = [
        agg_loss(loss[i : i + 1], mask[i : i + 1], Aggregation("seq-mean-token-mean", seqs=seqs))
        for i in range(4)
    ]
    assert float(sum(parts)) == pytest.approx(by_hand_seq)


def test_under_torchrun_a_micro_batch_is_one_forward_whatever_its_lengths():
    """Length buckets would give a rank a data-dependent number of forwards (each one a
    collective under DDP/FSDP2): with ``by_length=False`` a micro-batch stays one forward.
    Here 8 short groups and one long group, where buckets pay (the first split is checked)."""
    from ardea.data import TrajectoryBatch
    from ardea.trainer.step.split import split_updates

    lengths = [4] * 64 + [200] * 8  # 9 groups of 8 rows: padding dominates one forward
    mask = torch.tensor([[1] * n + [0] * (200 - n) for n in lengths])
    batch = TrajectoryBatch.from_tensors(
        torch.ones(72, 200, dtype=torch.long),
        mask,
        mask.bool(),
        group_ids=torch.arange(72) // 8,
    )
    split = dict(epochs=1, mini_batches=1, micro_batches=1, generator=torch.Generator())
    assert len(split_updates(batch, **split)[0]) > 1  # one process: buckets
    (update,) = split_updates(batch, **split, by_length=False)
    assert len(update) == 1 and update[0].rows == 72


def test_each_rank_takes_a_contiguous_share_of_every_micro_batchs_groups():
    """5 groups of 2, 1, 2, 2 and 1 rows: 2 ranks take groups 0-2 and 3-4, in batch order,
    and together every row once; with 4 ranks and a micro-batch of 3 groups the fourth
    rank's share is empty, and it gets a filler of the micro-batch's first group."""
    from ardea.data import TrajectoryBatch
    from ardea.trainer.step.split import Filler, shard_updates

    groups = torch.tensor([0, 0, 1, 2, 2, 3, 3, 4])
    ids = torch.arange(8)[:, None].repeat(1, 3)  # row i holds token i
    batch = TrajectoryBatch.from_tensors(ids, torch.ones_like(ids), ids > -1, group_ids=groups)
    shares = [shard_updates([[batch]], rank, 2)[0][0] for rank in range(2)]
    assert [s.input_ids[:, 0].tolist() for s in shares] == [[0, 1, 2, 3, 4], [5, 6, 7]]
    three = batch.select(torch.arange(5))  # groups 0, 1, 2
    shares = [shard_updates([[three]], rank, 4)[0][0] for rank in range(4)]
    assert [s.group_ids.tolist() for s in shares[:3]] == [[0, 0], [1], [2, 2]]
    assert isinstance(shares[3], Filler) and shares[3].batch.group_ids.tolist() == [0, 0]
    assert shard_updates([[batch]], 0, 1) == [[batch]]  # one process: as it is


def test_groups_are_found_by_id_when_their_rows_are_not_adjacent():
    """An agent rollout's rows arrive as its episodes finish: groups 8, 15, 0, 3 with rows
    interleaved and of uneven sizes (2, 2, 2, 3). Each group goes to one rank only (ids in
    increasing order: 0 and 3 to rank 0, 8 and 15 to rank 1) and every row is trained
    exactly once; finding groups by adjacency would see 6 groups and train groups 8 and 15
    on both ranks."""
    from ardea.data import TrajectoryBatch
    from ardea.trainer.step.split import shard_updates

    groups = torch.tensor([8, 8, 15, 0, 0, 3, 15, 3, 3])
    ids = torch.arange(9)[:, None].repeat(1, 3)  # row i holds token i
    batch = TrajectoryBatch.from_tensors(ids, torch.ones_like(ids), ids > -1, group_ids=groups)
    shares = [shard_updates([[batch]], rank, 2)[0][0] for rank in range(2)]
    assert [s.input_ids[:, 0].tolist() for s in shares] == [[3, 4, 5, 7, 8], [0, 1, 2, 6]]
    assert [s.group_ids.tolist() for s in shares] == [[0, 0, 3, 3, 3], [8, 8, 15, 15]]


def test_dynamic_sampling_keeps_the_groups_of_lowest_id_wherever_their_rows_are():
    """A refilled batch cut back to 2 groups keeps the two of lowest id (the step's first
    prompts), not the first two seen: rows of groups 5, 2, 9, 0 interleaved -> groups 0, 2."""
    from ardea.data import TrajectoryBatch
    from ardea.rollout.dynamic_sampling import first_groups

    groups = torch.tensor([5, 2, 2, 9, 5, 0, 9, 0])
    ids = torch.arange(8)[:, None].repeat(1, 2)
    batch = TrajectoryBatch.from_tensors(ids, torch.ones_like(ids), ids > -1, group_ids=groups)
    kept = first_groups(batch, 2)
    assert kept.input_ids[:, 0].tolist() == [1, 2, 5, 7]
    assert kept.group_ids.tolist() == [2, 2, 0, 0]
