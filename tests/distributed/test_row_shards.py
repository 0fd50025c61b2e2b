"""Pinning under torchrun scores every row once (:mod:`ardea.trainer.row_shards`): with
two processes, each rank scores its contiguous share of a rollout's rows and all-gathers
the shares, so every rank holds the whole result, and the FLOPs each rank counts are those
of its own rows (1/W of one process's for an even split).

The gathered scores are compared bit for bit with one process scoring the same shares (what
each rank computed), not with one forward of the whole batch: a smaller batch's products
may round differently, which is the kernels' business, not the gather's. Cost: two
torchrun launches of a tiny policy, 15-20 s each on two cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from test_torchrun import run, torchrun

from ardea.model import sequence_logprobs
from ardea.model.flops import COUNTER
from ardea.trainer.row_shards import RowShards

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from row_shards_worker import batch, tiny_policy  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_rank_takes_a_contiguous_share_and_the_shares_cover_the_rows_once():
    assert [list(RowShards(r, 2).share(5)) for r in range(2)] == [[0, 1, 2], [3, 4]]
    assert [list(RowShards(r, 3).share(7)) for r in range(3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [list(RowShards(r, 2).share(1)) for r in range(2)] == [[0], []]
    one = RowShards()
    assert one.map("anything", lambda b: ("called with", b)) == ("called with", "anything")


def scores_of(rows: list[int], rollout):
    """One process's scores of ``rows`` of ``rollout``, and the training FLOPs it counted."""
    policy = tiny_policy().eval()
    with torch.no_grad():
        before = COUNTER.totals()
        out = sequence_logprobs(
            policy, **rollout.select(torch.tensor(rows)).model_inputs(), top_logprobs=3
        )
        return out, COUNTER.since(before)["train"]


@pytest.mark.parametrize("rows", [5, 1])
def test_two_ranks_gather_the_scores_of_their_shares(tmp_path, rows):
    run(torchrun(str(HERE / "row_shards_worker.py"), str(tmp_path), str(rows)), timeout=300)
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    rollout = batch(rows)
    shares = [g["share"] for g in got]
    assert shares == ([[0, 1, 2], [3, 4]] if rows == 5 else [[0], []])
    parts = [scores_of(share, rollout) for share in shares if share]
    for name in ("logprobs", "top_ids", "top_logprobs"):
        expected = torch.cat([getattr(out, name) for out, _ in parts])
        assert expected.shape[0] == rows
        for rank in range(2):  # every rank holds the whole result
            torch.testing.assert_close(got[rank][name], expected, rtol=0, atol=0)
    for rank in range(2):
        torch.testing.assert_close(got[rank]["alone"], got[rank]["logprobs"], rtol=0, atol=0)
        assert got[rank]["aux_loss"] is None  # not a per-row value: dropped
    # each rank counted its own rows' FLOPs: together, one process's. The counts are float32
    # sums of at most 5 per-row terms: relative rounding <= 5 * 2**-24 = 3e-7 < 1e-6
    if rows == 5:
        _, whole = scores_of(list(range(rows)), rollout)
        for rank, (_, flops) in enumerate(parts):
            assert got[rank]["flops"] == pytest.approx(flops, rel=1e-6)
        assert sum(g["flops"] for g in got) == pytest.approx(whole, rel=1e-6)
        assert got[1]["flops"] < 0.6 * whole
