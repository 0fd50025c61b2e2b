"""Sharded checkpoints' files (ardea.trainer.shard_files) read without torchrun: joining
the ranks' shards into whole tensors, and the errors that name what is missing. The files
are written here by hand in the documented layout (rows of a split tensor in rank order,
a 0-d step count held by every rank), so the expected whole tensors are known."""

import json

import pytest
import torch
from safetensors.torch import save_file

from ardea.errors import ArdeaError
from ardea.trainer.shard_files import joined, shard_path, shard_world_size


def write(checkpoint, rank, world, tensors, layout):
    path = shard_path(checkpoint, rank, world)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"layout": json.dumps(layout)})


def test_shards_join_along_rows_in_rank_order(tmp_path):
    # a 5x2 weight split as torch.chunk splits it over 2 ranks (3 rows, then 2); a 3-row
    # moment over 4 ranks leaves the last rank an empty share
    weight = torch.arange(10.0).reshape(5, 2)
    moment = torch.tensor([7.0, 8.0, 9.0])
    layout = {"train/model/w": [[5, 2], True], "train/optim/w/step": [[], False],
              "train/optim/v/exp_avg": [[3], True]}  # fmt: skip
    world = 4
    weight_rows = [weight[0:2], weight[2:4], weight[4:5], weight[5:5]]
    for rank in range(world):
        write(tmp_path, rank, world, {
            "train/model/w": weight_rows[rank].contiguous(),
            "train/optim/w/step": torch.tensor(3.0),
            "train/optim/v/exp_avg": moment[rank : rank + 1].contiguous(),
        }, layout)  # fmt: skip
    assert shard_world_size(tmp_path) == world
    whole = joined(tmp_path, world)
    assert torch.equal(whole["train/model/w"], weight)
    assert torch.equal(whole["train/optim/v/exp_avg"], moment)
    assert whole["train/optim/w/step"].item() == 3.0


def test_another_world_size_needs_every_ranks_file(tmp_path):
    layout = {"train/model/w": [[2], True]}
    write(tmp_path, 0, 2, {"train/model/w": torch.ones(1)}, layout)
    with pytest.raises(ArdeaError, match=r"written by 2 processes and lacks shards/rank_00001-of-00002"):  # fmt: skip
        joined(tmp_path, 2)


def test_a_checkpoint_written_whole_has_no_shard_world_size(tmp_path):
    assert shard_world_size(tmp_path) is None
    write(tmp_path, 0, 2, {"x": torch.ones(1)}, {"x": [[1], False]})
    write(tmp_path, 0, 3, {"x": torch.ones(1)}, {"x": [[1], False]})
    with pytest.raises(ArdeaError, match=r"mixes the files of world sizes \[2, 3\]"):
        shard_world_size(tmp_path)
