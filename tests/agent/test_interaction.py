"""Interactions and their export: the seed's concatenation case, rewrites, call export,
reward discounting."""

from __future__ import annotations

import pytest
import torch

from ardea.agent import HistoryRewriteError, Interaction, discount_rewards, export_trajectories
from ardea.data import TrajectoryBatch


def call(inputs, outputs, parent=None, reward=0.0, version=1):
    return Interaction(
        list(inputs),
        list(outputs),
        [-0.1] * len(outputs),
        version,
        parent=parent,
        reward=reward,
    )


def batch(trajectories):
    return TrajectoryBatch.from_trajectories(trajectories, pad_token_id=0)


def test_child_concatenates_onto_parent_with_structured_turn_ids():
    parent = call([1, 2], [3, 4])
    child = call([1, 2, 3, 4, 5], [6, 7], parent=parent, reward=1.0)
    b = batch(export_trajectories([parent, child]))
    assert b.rows == 1
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7]]
    assert b.turn_ids.tolist() == [[-1, -1, 0, 0, -1, 1, 1]]
    assert b.loss_mask.tolist() == [[False, False, True, True, False, True, True]]
    assert b.logprobs[0].tolist() == pytest.approx([0, 0, -0.1, -0.1, 0, -0.1, -0.1])
    assert b.versions.tolist() == [[-1, -1, 1, 1, -1, 1, 1]]
    assert b.rewards.tolist() == [1.0]


def test_a_version_per_generated_span():
    parent = call([1, 2], [3, 4], version=3)
    child = call([1, 2, 3, 4, 5], [6], parent=parent, version=4)
    assert batch(export_trajectories([parent, child])).versions.tolist() == [[-1, -1, 3, 3, -1, 4]]


def test_rewritten_history_is_an_error_naming_the_position():
    parent = call([1, 2], [3, 4])
    child = call([1, 2, 9, 4, 5], [6, 7], parent=parent)
    with pytest.raises(HistoryRewriteError, match="differ from position 2 of 4.*rewrote history"):
        export_trajectories([parent, child])


def test_new_trajectory_policy_splits_at_the_rewrite():
    parent = call([1, 2], [3, 4], reward=0.5)
    child = call([1, 2, 9, 5], [6, 7], parent=parent, reward=1.0)
    grandchild = call([1, 2, 9, 5, 6, 7, 8], [10], parent=child, reward=2.0)
    rows = export_trajectories([parent, child, grandchild], history="new_trajectory")
    b = batch(rows)
    assert b.rows == 2
    assert b.input_ids[0, :4].tolist() == [1, 2, 3, 4]
    assert b.turn_ids[0, :4].tolist() == [-1, -1, 0, 0]
    assert b.input_ids[1].tolist() == [1, 2, 9, 5, 6, 7, 8, 10]
    assert b.turn_ids[1].tolist() == [-1, -1, -1, -1, 0, 0, -1, 1]
    assert b.rewards.tolist() == [0.5, 3.0]


def test_branches_share_their_prefix_and_call_export_gives_one_row_per_call():
    root = call([1], [2])
    left = call([1, 2, 3], [4], parent=root, reward=1.0)
    right = call([1, 2, 5], [6], parent=root, reward=0.0)
    conv = batch(export_trajectories([root, left, right]))
    assert conv.input_ids.tolist() == [[1, 2, 3, 4], [1, 2, 5, 6]]
    per_call = batch(export_trajectories([root, left, right], style="call"))
    assert per_call.rows == 3
    assert per_call.turn_ids.tolist() == [[-1, 0, -1, -1], [-1, -1, -1, 0], [-1, -1, -1, 0]]


def test_discount_propagates_a_final_reward_back_per_turn():
    first = call([1], [2])
    second = call([1, 2, 3], [4], parent=first)
    third = call([1, 2, 3, 4, 5], [6], parent=second, reward=1.0)
    discount_rewards([first, second, third], 0.5)
    assert [first.reward, second.reward, third.reward] == [0.25, 0.5, 1.0]
    rows = export_trajectories([first, second, third], style="call")
    torch.testing.assert_close(batch(rows).rewards, torch.tensor([0.25, 0.5, 1.0]))


@pytest.mark.parametrize("bad", [{"style": "turns"}, {"history": "ignore"}])
def test_unknown_export_options_are_errors(bad):
    with pytest.raises(ValueError, match="choose"):
        export_trajectories([call([1], [2])], **bad)
