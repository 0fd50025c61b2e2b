"""Which checkpoint the ranks of a job resume from when each node reads its own disk
(ardea.trainer.node_disks.latest_common; the two-node runs are in
tests/distributed/test_two_nodes.py)."""

import pytest

from ardea.errors import ArdeaError
from ardea.trainer.node_disks import latest_common

S1, S2, S3 = "step_0000001", "step_0000002", "step_0000003"


def test_the_latest_step_every_rank_holds():
    assert latest_common([[S1, S2, S3], [S1, S2, S3]]) == S3  # a shared disk: all the same
    assert latest_common([[S1, S2, S3], [S1, S2]]) == S2  # a node killed while writing step 3
    assert latest_common([[S2, S3], [S1, S2]]) == S2  # pruned differently (keep_last)
    assert latest_common([[], []]) is None  # a new run


def test_no_checkpoint_in_common_names_each_ranks_latest():
    with pytest.raises(ArdeaError, match=r"rank 0: step_0000002; rank 1: none"):
        latest_common([[S1, S2], []])
    with pytest.raises(ArdeaError, match=r"rank 0: step_0000001; rank 1: step_0000003"):
        latest_common([[S1], [S3]])
