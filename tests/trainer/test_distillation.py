"""On-policy distillation (``algo.teacher``) and the reference's log-probs, through real
training steps: the teacher's per-token rewards reach the advantages with the values worked
out here by hand, both KL estimators; the reference and the teacher score each rollout once
per step whatever the epochs and mini-batches; a teacher is refused where it cannot work.

Tolerance 1e-4, from float32 rounding (unit roundoff u = 6e-8): the teacher's log-probs
come from the trainer's chunked scorer (backbone, then the LM head) against one full
float32 forward + float64 log-softmax here. Each logit passes ~8 dependent dot products of
length ≤ 64 (width 32, MLP 64), ≤ 64·u ≈ 4e-6 relative each, on logits of magnitude ≤ 10:
≤ 4e-5 per log q in the worst case, times coef ≤ 2 in the rewards. The outcome part
(rewards from the same function, divided by a group std) adds ~1e-7 relative."""

from __future__ import annotations

import json

import pytest
import torch
from online_testing import RUN, group_advantages, naive_token_logprobs
from tiny_models import SMALL_OVERRIDES, small_model

from ardea.config import load_config
from ardea.errors import ConfigError
from ardea.model import build_char_tokenizer, build_tiny_model
from ardea.trainer import Trainer, run


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A small model of another seed with the policy's (character) tokenizer."""
    path = tmp_path_factory.mktemp("teacher")
    small_model(seed=7).save_pretrained(path)
    build_char_tokenizer().save_pretrained(path)
    return path


def trainer_for(tmp_path, *overrides: str) -> Trainer:
    config = load_config(None, [*RUN, *overrides, f"trainer.output_dir={tmp_path}"])
    return Trainer(config)


def capture_pins(trainer: Trainer) -> list:
    """Every (rollout before, rollout after, metrics) the RL step pins, in order: the
    frozen scorers' values, then the strategy's."""
    pins, before = [], []
    scorers_pin, strategy_pin = trainer.strategy.scorers.pin, trainer.strategy.pin

    def scored(batch, metrics):
        before.append(batch)
        return scorers_pin(batch, metrics)

    def recording(batch, metrics):
        pinned = strategy_pin(batch, metrics)
        pins.append((before[-1], pinned, dict(metrics)))
        return pinned

    trainer.strategy.scorers.pin = scored
    trainer.strategy.pin = recording
    return pins


def teacher_logprobs(batch) -> torch.Tensor:
    """``(N, S)`` float64 log q of every next token (the last column, past the row, 0)."""
    q = naive_token_logprobs(small_model(seed=7), batch)
    return torch.nn.functional.pad(q, (0, 1))


@pytest.mark.parametrize("kl", ["reverse_k1", "reverse_k3"])
def test_the_teachers_token_rewards_reach_the_advantages(kl, teacher_dir, tmp_path, reward_module):
    trainer = trainer_for(
        tmp_path,
        "trainer.max_steps=1",
        f"algo.teacher={{path: {teacher_dir}, kl: {kl}, coef: 0.5}}",
    )
    pins = capture_pins(trainer)
    trainer.train_step()
    before, pinned, metrics = pins[0]
    q = teacher_logprobs(before)  # (N, S) log q of each sampled token
    p = before.behaviour_logprobs.double()
    mask = before.action_mask
    log_ratio = torch.where(mask, q - p, 0.0)  # log q/p
    per_token = log_ratio.neg() if kl == "reverse_k1" else log_ratio.exp() - 1 - log_ratio
    rewards = torch.where(mask, -0.5 * per_token, 0.0)
    outcome = torch.tensor(group_advantages(before.rewards.tolist(), 8), dtype=torch.float64)
    expected = torch.where(mask, outcome[:, None] + rewards, 0.0)
    torch.testing.assert_close(pinned.advantages.double(), expected, atol=1e-4, rtol=1e-5)
    assert rewards[mask].abs().max() > 0.01  # a real teacher term, not a vanishing one
    kl_k1 = float(torch.where(mask, p - q, 0.0).sum() / mask.sum())
    assert metrics["teacher/reverse_kl"] == pytest.approx(kl_k1, abs=1e-4)
    assert metrics["teacher/reward_mean"] == pytest.approx(
        float(rewards.sum() / mask.sum()), abs=1e-4
    )


def test_the_reference_and_the_teacher_score_each_rollout_once_per_step(
    teacher_dir, tmp_path, reward_module
):
    trainer = trainer_for(
        tmp_path,
        "trainer.max_steps=2",
        "algo.ppo_epochs=2",
        "algo.ppo_mini_batches=2",
        "algo.ppo.kl_ctl=0.1",
        f"algo.teacher.path={teacher_dir}",
    )
    pins = capture_pins(trainer)
    for _ in range(2):
        trainer.train_step()
        trainer.step += 1
    rows = sum(pinned.rows for _, pinned, _ in pins)
    assert rows == 2 * 8 * 8  # two steps of 8 prompts x 8 completions
    # 2 epochs x 2 mini-batches would score each row 4 times if the loss scored it
    assert trainer.strategy.reference.rows_scored == rows
    assert trainer.strategy.scorers.teacher.scorer.rows_scored == rows
    assert all(pinned.ref_logprobs is not None for _, pinned, _ in pins)


def test_online_ppo_takes_the_teachers_rewards_into_gae(teacher_dir, tmp_path, reward_module):
    trainer = trainer_for(
        tmp_path,
        "trainer.max_steps=1",
        "algo.name=online_ppo",
        "algo.ppo.gae_lambda=1.0",
        "algo.ppo.discount=1.0",
        f"algo.teacher={{path: {teacher_dir}, coef: 2.0}}",
    )
    pins = capture_pins(trainer)
    trainer.train_step()
    before, pinned, _ = pins[0]
    q = teacher_logprobs(before)
    p = before.behaviour_logprobs.double()
    mask = before.action_mask
    rewards = torch.where(mask, -2.0 * (p - q), 0.0)
    # gamma = lambda = 1: return_t = outcome + sum of the token rewards from t on
    tail = rewards.flip(-1).cumsum(-1).flip(-1)
    expected = torch.where(mask, before.rewards.double()[:, None] + tail, 0.0)
    torch.testing.assert_close(pinned.returns.double(), expected, atol=1e-4, rtol=1e-5)


def naive_log_softmax(model, batch) -> torch.Tensor:
    """``(N, S, V)`` float64 next-token log-softmax at T = 1 from one full forward."""
    attn = batch.attention_mask
    positions = (attn.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=attn, position_ids=positions)
    return torch.log_softmax(logits.logits.double(), dim=-1)


@pytest.mark.parametrize("name", ["online_grpo", "online_ppo"])
def test_forward_topk_pins_the_teachers_top_tokens_and_adds_its_kl_to_the_loss(
    name, teacher_dir, tmp_path, reward_module
):
    """kl=forward_topk: the teacher's 5 most likely next tokens (and their log q) are
    pinned at every trained position, as a full float64 forward of the teacher gives them;
    the update's train/forward_kl is sum_j q~_j (log q~_j - log p_j) by hand over the
    student as it was; with the task reward weighted 0 (zero advantages) the loss is that
    term alone times coef, and it is what moves the weights."""
    import copy

    trainer = trainer_for(
        tmp_path,
        "trainer.max_steps=1",
        f"algo.name={name}",
        "algo.ppo.kl_ctl=0.0",
        "reward.functions=[{name: ardea_test_rewards.digit_fraction, weight: 0.0}]",
        f"algo.teacher={{path: {teacher_dir}, kl: forward_topk, coef: 0.5, top_k: 5}}",
    )
    student = copy.deepcopy(trainer.strategy.policy)
    pins = capture_pins(trainer)
    logged = trainer.train_step()
    before, pinned, _ = pins[0]
    mask = before.action_mask
    assert before.teacher_top_ids is None and pinned.teacher_top_ids.shape[-1] == 5
    values, ids = naive_log_softmax(small_model(seed=7), before).topk(5, dim=-1)
    assert torch.equal(pinned.teacher_top_ids[mask], ids[mask])
    torch.testing.assert_close(
        pinned.teacher_top_logprobs[mask].double(), values[mask], atol=1e-4, rtol=0
    )
    p = naive_log_softmax(student, before).gather(-1, ids)  # the student's log p of them
    q = torch.log_softmax(values, dim=-1)  # the teacher renormalised over its top 5
    per_token = (q.exp() * (q - p)).sum(-1)
    expected = float(per_token[mask].mean())
    assert expected > 0.05  # two different models: a real term
    assert logged["train/forward_kl"] == pytest.approx(expected, abs=1e-4)
    assert float(pinned.advantages.abs().max()) == 0.0  # the task reward weighs 0
    term = 0.5 * expected
    if name == "online_grpo":  # no critic loss beside it
        assert logged["train/loss"] == pytest.approx(term, abs=1e-4)
    assert logged["train/grad_norm"] > 0  # the term's gradient: the policy loss has none
    assert "teacher/reward_mean" not in logged and "teacher/reverse_kl" in logged


def test_a_teacher_is_refused_where_it_cannot_work(teacher_dir, tmp_path):
    sft = [*SMALL_OVERRIDES, "algo.name=sft", "data.task=arithmetic", "trainer.max_steps=1"]
    with pytest.raises(ConfigError, match="algo.name=sft does not learn from a teacher"):
        run(
            load_config(
                None,
                [*sft, f"algo.teacher.path={teacher_dir}", f"trainer.output_dir={tmp_path / 'a'}"],
            )
        )
    other = tmp_path / "other_vocabulary"
    tokenizer = build_char_tokenizer()
    tokenizer.add_tokens(["<extra>"])
    build_tiny_model(
        tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1
    ).save_pretrained(other)
    tokenizer.save_pretrained(other)
    online = [
        *SMALL_OVERRIDES,
        "algo.name=online_grpo",
        "data.task=arithmetic",
        "trainer.max_steps=1",
    ]
    with pytest.raises(ConfigError, match="teacher's tokenizer differs from the policy's"):
        run(
            load_config(
                None,
                [*online, f"algo.teacher.path={other}", f"trainer.output_dir={tmp_path / 'b'}"],
            )
        )
    with pytest.raises(Exception, match="algo.teacher.path directory /nowhere does not exist"):
        run(
            load_config(
                None,
                [*online, "algo.teacher.path=/nowhere", f"trainer.output_dir={tmp_path / 'c'}"],
            )
        )
    assert not any((tmp_path / name).exists() for name in "abc")


def test_the_teachers_options_are_checked_by_name(teacher_dir, tmp_path):
    base = [*RUN, f"trainer.output_dir={tmp_path}", f"algo.teacher.path={teacher_dir}"]
    with pytest.raises(ConfigError, match=r"algo.teacher.top_k=8 is read by kl=forward_topk"):
        load_config(None, [*base, "algo.teacher.top_k=8"])
    with pytest.raises(ConfigError, match=r"algo.teacher.top_k=0 must be an integer >= 1"):
        load_config(None, [*base, "algo.teacher.kl=forward_topk", "algo.teacher.top_k=0"])
    with pytest.raises(ConfigError, match=r"algo.teacher.kl='forward'.*forward_topk"):
        load_config(None, [*base, "algo.teacher.kl=forward"])
    with pytest.raises(ConfigError, match=r"algo.teacher.url='http://x:1' is read by engine=vllm"):
        load_config(None, [*base, "algo.teacher.url=http://x:1"])
    bare = [*RUN, f"trainer.output_dir={tmp_path}"]
    with pytest.raises(ConfigError, match=r"algo.teacher.engine='vllm' set without a teacher"):
        load_config(None, [*bare, "algo.teacher.engine=vllm"])
    served = [*base, "algo.teacher.engine=vllm", "algo.teacher.url=http://127.0.0.1:9"]
    for sampling in ("rollout.temperature=0.7", "rollout.top_p=0.9"):
        with pytest.raises(ConfigError, match=r"scores at temperature 1 without top-k / top-p"):
            Trainer(load_config(None, [*served, sampling]))
    too_many = load_config(None, [*base, "algo.teacher.kl=forward_topk", "algo.teacher.top_k=999"])
    with pytest.raises(ConfigError, match=r"top_k=999 exceeds the teacher's \d+ output tokens"):
        Trainer(too_many)


def test_a_stage_distils_from_an_earlier_stage(tmp_path):
    stages = (
        "stages={teacher: {algo: {name: sft}, data: {train_size: 64}, "
        "trainer: {max_steps: 3, batch_size: 8, eval_every: 0}}, "
        "student: {algo: {name: online_grpo, teacher: {path: 'stage:teacher'}}, "
        "model: {path: null}, reward: {functions: [{name: task, weight: 0.0}]}, "
        "rollout: {group_size: 2, max_new_tokens: 4}, "
        "trainer: {max_steps: 2, batch_size: 4, eval_every: 0}}}"
    )
    top = tmp_path / "run"
    overrides = [
        *SMALL_OVERRIDES,
        "data.task=arithmetic",
        "data.task_args.digits=1",
        "data.eval_size=8",
    ]
    run(
        load_config(
            None, [*overrides, stages, "logging.progress=false", f"trainer.output_dir={top}"]
        )
    )
    student = load_config(top / "student" / "config.yaml")
    assert student.algo.teacher.path == str(
        top / "teacher" / "checkpoints" / "step_0000003" / "policy"
    )
    assert student.model.path is None  # a student from scratch, not the teacher
    logged = [json.loads(line) for line in (top / "student" / "metrics.jsonl").open()]
    gaps = [row["teacher/reverse_kl"] for row in logged if "teacher/reverse_kl" in row]
    assert gaps and all(abs(gap) > 1e-3 for gap in gaps)  # two different models
