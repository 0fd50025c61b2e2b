"""Checkpoints are atomic; damaged ones are skipped with a warning naming them."""

import pytest
import torch

from ardea.model import build_char_tokenizer, build_tiny_model
from ardea.trainer.checkpoint import (
    begin_checkpoint,
    checkpoint_dir,
    finish_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_trainer_state,
    write_checkpoint,
)


def save_checkpoint(run_dir, step, *, policy, tokenizer, state, keep_last):
    """One process's checkpoint of ``step``, as the trainer writes it."""
    final = checkpoint_dir(run_dir, step)
    tmp = begin_checkpoint(final)
    write_checkpoint(tmp, policy=policy, tokenizer=tokenizer, state=state)
    return finish_checkpoint(tmp, final, step, run_dir=run_dir, keep_last=keep_last)


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32
    )
    return model, tokenizer


def test_save_keeps_last_and_round_trips_state(tmp_path, tiny):
    model, tokenizer = tiny
    for step in (1, 2, 3):
        save_checkpoint(
            tmp_path,
            step,
            policy=model,
            tokenizer=tokenizer,
            state={"step": step, "x": torch.arange(3)},
            keep_last=2,
        )
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000002", "step_0000003"]
    state = load_trainer_state(latest_checkpoint(tmp_path))
    assert state["step"] == 3 and state["x"].tolist() == [0, 1, 2]
    assert not list((tmp_path / "checkpoints").glob(".tmp_*"))


def test_partial_and_truncated_checkpoints_are_skipped(tmp_path, tiny, capsys):
    model, tokenizer = tiny
    good = save_checkpoint(
        tmp_path, 5, policy=model, tokenizer=tokenizer, state={"step": 5}, keep_last=5
    )
    partial = tmp_path / "checkpoints" / "step_0000006"
    partial.mkdir()
    (partial / "trainer_state.pt").write_bytes(b"half")
    cut = save_checkpoint(
        tmp_path, 7, policy=model, tokenizer=tokenizer, state={"step": 7}, keep_last=5
    )
    weights = cut / "policy" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert latest_checkpoint(tmp_path) == good
    assert latest_checkpoint(tmp_path) == good  # said once per checkpoint
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "checkpoint" in line]
    assert len(lines) == 2 and all(line.startswith("ardea: skipping checkpoint") for line in lines)
    assert "UserWarning" not in err
    assert "step_0000006" in lines[0] and "COMPLETE" in lines[0]
    assert "step_0000007" in lines[1] and "model.safetensors" in lines[1]
