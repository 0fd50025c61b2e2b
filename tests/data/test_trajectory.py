"""TrajectoryBatch: built from segments, validated on construction, aligned in one place."""

from dataclasses import replace

import pytest
import torch

from ardea.data import Segment, Trajectory, TrajectoryBatch, action_positions

PAD = 0


def agent_turns() -> Trajectory:
    """Prompt [11, 12], turn 0 [21, 22] at version 3, tool output [31, 32, 33], turn 1 [41]
    at version 4."""
    return Trajectory(
        (
            Segment.prompt([11, 12]),
            Segment.generated([21, 22], [-0.1, -0.2], version=3),
            Segment.context([31, 32, 33]),
            Segment.generated([41], [-0.4], version=4),
        ),
        reward=1.5,
        group_id=7,
    )


def test_three_segments_token_by_token():
    short = Trajectory((Segment.prompt([13]), Segment.generated([51], [-0.5], version=4)))
    batch = TrajectoryBatch.from_trajectories([agent_turns(), short], pad_token_id=PAD)
    assert batch.input_ids.tolist() == [
        [11, 12, 21, 22, 31, 32, 33, 41],
        [13, 51, PAD, PAD, PAD, PAD, PAD, PAD],
    ]
    assert batch.attention_mask.tolist() == [[1] * 8, [1, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.loss_mask.int().tolist() == [[0, 0, 1, 1, 0, 0, 0, 1], [0, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.turn_ids.tolist() == [
        [-1, -1, 0, 0, -1, -1, -1, 1],
        [-1, 0, -1, -1, -1, -1, -1, -1],
    ]
    assert batch.versions.tolist() == [
        [-1, -1, 3, 3, -1, -1, -1, 4],
        [-1, 4, -1, -1, -1, -1, -1, -1],
    ]
    torch.testing.assert_close(
        batch.logprobs,
        torch.tensor([[0, 0, -0.1, -0.2, 0, 0, 0, -0.4], [0, -0.5, 0, 0, 0, 0, 0, 0]]),
    )
    assert batch.rewards.tolist() == [1.5, 0.0] and batch.group_ids.tolist() == [7, 0]
    # next-token alignment: position t emits token t + 1 (the model's outputs)
    assert batch.action_mask.int().tolist() == [
        [0, 1, 1, 0, 0, 0, 1, 0],
        [1, 0, 0, 0, 0, 0, 0, 0],
    ]
    torch.testing.assert_close(
        batch.behaviour_logprobs,
        torch.tensor([[0, -0.1, -0.2, 0, 0, 0, -0.4, 0], [-0.5, 0, 0, 0, 0, 0, 0, 0]]),
    )


def test_seed_interaction_case():
    """Seed 000: parent [1, 2] -> [3, 4], child [1, 2, 3, 4, 5] -> [6, 7] concatenated
    gives turn ids [-1, -1, 0, 0, -1, 1, 1]."""
    trajectory = Trajectory(
        (
            Segment.prompt([1, 2]),
            Segment.generated([3, 4]),
            Segment.context([5]),
            Segment.generated([6, 7]),
        )
    )
    batch = TrajectoryBatch.from_trajectories([trajectory], pad_token_id=PAD)
    assert batch.turn_ids.tolist() == [[-1, -1, 0, 0, -1, 1, 1]]
    assert batch.logprobs is None  # demonstrations carry no behaviour log-probs


def test_row_operations_keep_the_layout():
    batch = TrajectoryBatch.from_trajectories(
        [agent_turns(), Trajectory((Segment.prompt([9]), Segment.generated([8], [-1.0])))],
        pad_token_id=PAD,
    )
    second = batch.select(torch.tensor([1])).trim()
    assert second.input_ids.tolist() == [[9, 8]] and second.turn_ids.tolist() == [[-1, 0]]
    both = TrajectoryBatch.concat([second, batch.select(torch.tensor([0]))], pad_token_id=PAD)
    assert both.input_ids.shape == (2, 8) and both.versions[0].tolist() == [-1, -1] + [-1] * 6
    assert both.turn_ids[0, 2:].tolist() == [-1] * 6  # padding of turn ids is -1
    pinned = batch.pin(advantages=torch.ones(2, 8))
    assert pinned.advantages.shape == (2, 8) and batch.advantages is None
    with pytest.raises(ValueError, match="cannot pin \\['rewards'\\]"):
        batch.pin(rewards=torch.ones(2))


def test_a_teachers_top_tokens_follow_the_rows_and_columns():
    """(N, S, k) pinned fields are selected, trimmed and padded along rows and columns as
    the (N, S) ones are, and checked: both or neither, the same k, ids of an integer dtype."""
    batch = TrajectoryBatch.from_trajectories(
        [agent_turns(), Trajectory((Segment.prompt([9]), Segment.generated([8], [-1.0])))],
        pad_token_id=PAD,
    )
    ids = torch.arange(2 * 8 * 3).reshape(2, 8, 3)
    pinned = batch.pin(teacher_top_ids=ids, teacher_top_logprobs=-ids.float())
    second = pinned.select(torch.tensor([1])).trim()
    assert second.teacher_top_ids.tolist() == ids[1:, :2].tolist()
    both = TrajectoryBatch.concat([second, pinned.select(torch.tensor([0]))], pad_token_id=PAD)
    assert both.teacher_top_ids.shape == (2, 8, 3)
    assert both.teacher_top_ids[0, 2:].tolist() == [[0] * 3] * 6  # padded columns
    assert both.teacher_top_logprobs[1].tolist() == (-ids[0].float()).tolist()
    with pytest.raises(ValueError, match="pinned together"):
        batch.pin(teacher_top_ids=ids)
    with pytest.raises(ValueError, match=r"teacher_top_logprobs: must have shape \(N, S, k\)"):
        batch.pin(teacher_top_ids=ids, teacher_top_logprobs=torch.zeros(2, 8, 4))
    with pytest.raises(ValueError, match="teacher_top_ids: must have a int dtype"):
        batch.pin(teacher_top_ids=ids.float(), teacher_top_logprobs=ids.float())


def test_turn_ids_from_runs_of_trained_tokens():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0, 1, 1]]).bool()
    batch = TrajectoryBatch.from_tensors(torch.ones(1, 8, dtype=torch.long), torch.ones(1, 8), mask)
    assert batch.turn_ids.tolist() == [[-1, 0, 0, -1, 1, -1, 2, 2]]
    assert action_positions(mask).int().tolist() == [[1, 1, 0, 1, 0, 1, 1, 0]]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            dict(attention_mask=torch.tensor([[1, 1, 0, 1]])),
            r"attention_mask: rows must be right-padded \(1s, then 0s\) \(row 0\)",
        ),
        (
            dict(loss_mask=torch.tensor([[0, 1, 1, 1]]).bool()),
            r"loss_mask: marks a padding token \(row 0\)",
        ),
        (
            dict(turn_ids=torch.tensor([[-1, -1, 0, -1]])),
            r"turn_ids: a trained token has no turn id \(row 0\)",
        ),
        (dict(turn_ids=torch.tensor([[-1, 1, 0, -1]])), r"turn_ids: turn ids must not decrease"),
        (dict(versions=torch.tensor([[-2, 0, 0, -1]])), r"versions: must be >= -1"),
        (
            dict(logprobs=torch.tensor([[0.0, float("nan"), 0.0, 0.0]])),
            r"logprobs: must be finite on trained tokens \(row 0\)",
        ),
        (
            dict(rewards=torch.tensor([1.0, 2.0])),
            r"rewards: must have shape \(N,\) = \(1,\), got \(2,\)",
        ),
        (dict(group_ids=torch.tensor([0.5])), r"group_ids: must have a int dtype"),
        (dict(loss_mask=torch.tensor([[0, 1, 1, 0]])), r"loss_mask: must have a bool dtype"),
        (dict(temperature=0.0), r"temperature: must be > 0"),
        (dict(advantages=torch.zeros(1, 3)), r"advantages: must have shape \(N, S\) = \(1, 4\)"),
    ],
)
def test_validation_names_the_field_and_row(change, message):
    good = TrajectoryBatch.from_tensors(
        torch.tensor([[5, 6, 7, PAD]]),
        torch.tensor([[1, 1, 1, 0]]),
        torch.tensor([[0, 1, 1, 0]]).bool(),
    )
    with pytest.raises(ValueError, match=message):
        replace(good, **change)


def test_mixed_logprobs_are_refused():
    with_lp = Trajectory((Segment.prompt([1]), Segment.generated([2], [-0.1])))
    without = Trajectory((Segment.prompt([1]), Segment.generated([2])))
    with pytest.raises(ValueError, match="some generated segments carry behaviour log-probs"):
        TrajectoryBatch.from_trajectories([with_lp, without], pad_token_id=PAD)
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        Segment.generated([2, 3], [-0.1])
    with pytest.raises(ValueError, match="a context segment carries no log-probs"):
        Segment("context", (1,), (-0.1,))


def test_routed_experts_collate_with_minus_one_where_a_row_has_none():
    routed = torch.tensor([[[0, 1]], [[2, 3]], [[1, 2]]], dtype=torch.int8)  # 3 tokens, L 1, K 2
    rows = [
        Trajectory((Segment.prompt([5, 6]), Segment.generated([7])), routed_experts=routed),
        Trajectory((Segment.prompt([5]), Segment.generated([8]))),
    ]
    batch = TrajectoryBatch.from_trajectories(rows, pad_token_id=0)
    assert batch.routed_experts.shape == (2, 3, 1, 2)
    assert torch.equal(batch.routed_experts[0], routed)
    assert bool((batch.routed_experts[1] == -1).all())
    assert torch.equal(batch.model_inputs()["routed_experts"], batch.routed_experts)
    short = Trajectory((Segment.prompt([5]), Segment.generated([8])), routed_experts=routed)
    with pytest.raises(ValueError, match="trajectory 0 has 2 tokens but routed experts for 3"):
        TrajectoryBatch.from_trajectories([short], pad_token_id=0)
