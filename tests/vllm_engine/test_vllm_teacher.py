"""A distillation teacher served by vLLM (``algo.teacher.engine: vllm``), on real servers: its
prompt log-probs and top tokens equal the in-process teacher's on the same weights, and a
training run that starts its own teacher server scores every rollout there once per step
(the teacher's reverse KL recomputed here) and stops the server when it ends.

Tolerance 1e-4 on log-probs: both sides run the model in float32 (vLLM's CPU kernels and
torch's sum in other orders: ~1e-6 relative per op over a 2-layer model, logits ~ 1), the
bound the vLLM engine's own weight-sync check uses."""

from __future__ import annotations

import pytest
import torch
from vllm_testing import PYTHON, SIZE_OVERRIDES, TOKENIZER, engine_on, tiny

from ardea.config import load_config
from ardea.data import Segment, Trajectory, TrajectoryBatch
from ardea.rollout.engines.vllm.scoring import VLLMPromptScorer
from ardea.trainer import Trainer
from ardea.trainer.scorers.token_scorer import ServedTokenScorer, TokenScorer

pytestmark = pytest.mark.slow  # real vLLM servers


def rows_of(texts: list[tuple[str, str]]) -> TrajectoryBatch:
    """(prompt, completion) pairs as a right-padded batch sampled at temperature 1."""
    trajectories = []
    for prompt, completion in texts:
        generated = TOKENIZER.encode(completion, add_special_tokens=False)
        trajectories.append(
            Trajectory(
                (
                    Segment.prompt(TOKENIZER.encode(prompt, add_special_tokens=False)),
                    Segment.generated(generated, [-1.0] * len(generated)),
                )
            )
        )
    return TrajectoryBatch.from_trajectories(trajectories, pad_token_id=TOKENIZER.pad_token_id)


def test_a_served_teacher_scores_as_the_in_process_one(vllm_url, tmp_path):
    teacher = tiny(seed=5)
    engine = engine_on(vllm_url, teacher, tmp_path)  # the server now holds these weights
    try:
        batch = rows_of([("12+34=", "46"), ("7+8=", "15 and more"), ("1+1=", "2")])
        served = ServedTokenScorer(VLLMPromptScorer(vllm_url, timeout_s=60.0))
        got = served.scores(batch, top=4)
        expected = TokenScorer(teacher, chunk_size=64).scores(batch, top=4)
    finally:
        engine.close()
    scored = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
    scored[:, :-1] = batch.attention_mask[:, 1:].bool()  # every next token of the row
    assert served.rows_scored == 3 and int(scored.sum()) == (6 + 2) + (4 + 11) + (4 + 1) - 3
    torch.testing.assert_close(got.logprobs[scored], expected.logprobs[scored], atol=1e-4, rtol=0)
    assert not got.logprobs[~scored].any() and not got.top_ids[~scored].any()
    torch.testing.assert_close(
        got.top_logprobs[scored], expected.top_logprobs[scored], atol=1e-4, rtol=0
    )
    # the same tokens, at every position whose top 4 are further apart than the tolerance
    # (closer ones are ordered by the rounding)
    tie_free = (expected.top_logprobs[scored].diff(dim=-1).abs() > 1e-4).all(dim=-1)
    assert tie_free.float().mean() > 0.9
    assert torch.equal(got.top_ids[scored][tie_free], expected.top_ids[scored][tie_free])


def test_a_run_starts_its_teachers_server_scores_there_and_stops_it(tmp_path):
    teacher_dir = tmp_path / "teacher"  # not the student's seed: a nonzero KL to check
    tiny(seed=5).save_pretrained(teacher_dir)
    TOKENIZER.save_pretrained(teacher_dir)
    overrides = [
        *SIZE_OVERRIDES,
        "model.compute_dtype=float32",
        "algo.name=online_grpo",
        "reward.functions=[{name: format_regex, kwargs: {pattern: '[0-4]'}, weight: 0.0}]",
        f"algo.teacher={{path: {teacher_dir}, engine: vllm, python: {PYTHON}}}",
        "rollout.max_new_tokens=6",
        "rollout.group_size=4",
        "trainer.batch_size=4",
        "trainer.max_steps=2",
        "trainer.eval_every=0",
        "data.eval_size=4",
        "logging.progress=false",
        "logging.tensorboard=false",
        "logging.report=false",  # no report.png: half a second a run
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    trainer = Trainer(load_config(None, overrides))
    served = trainer.strategy.scorers.teacher.scorer
    assert served.server is not None and served.server.alive
    pins = []
    pin = trainer.strategy.pin

    def recording(batch, metrics):
        pinned = pin(batch, metrics)
        pins.append((batch, dict(metrics)))
        return pinned

    trainer.strategy.pin = recording
    trainer.train()
    assert not served.server.alive  # stopped with the run
    assert served.rows_scored == 2 * 4 * 4
    local = TokenScorer(tiny(seed=5), chunk_size=64)
    for batch, metrics in pins:
        mask = batch.action_mask
        q = local.logprobs(batch)
        gap = float(((batch.behaviour_logprobs - q).where(mask, 0.0)).sum() / mask.sum())
        assert abs(gap) > 0.01 and metrics["teacher/reverse_kl"] == pytest.approx(gap, abs=1e-4)
