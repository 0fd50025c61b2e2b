"""``reward_model``: the scorer starts on the policy's backbone with a zero head; the loss is
Bradley–Terry on scores read independently from the backbone's hidden states; a run saves a
checkpoint plain transformers loads, and the ``reward_model`` reward function gives a
completion the score the trained model gave the same pair's row.

Tolerances, from float32 rounding (unit roundoff u = 6e-8): a dot product of length K is
off by at most about K·u relative, K ≤ 64 here (width 32, MLP 64), so ≤ 4e-6 per matmul.
The loss by transformers' classifier against the hand-made scores takes the same backbone
forward and differs in the head's sum over 32 features only: rel 1e-5. The reward
function's scores come from differently padded batches (other matmul shapes and summation
orders through the ~8 dependent matmuls of 2 layers): up to ~3e-5 relative, so rtol 1e-4,
with atol 1e-5 for scores near 0."""

import json

import pytest
import torch
import torch.nn.functional as F
from strategy_testing import PAD, TOKENIZER, build, pad_rows, random_rows, tiny_policy
from tiny_models import SMALL_OVERRIDES
from transformers import AutoModelForSequenceClassification

from ardea.config import load_config
from ardea.data import TrajectoryBatch, make_task, task_preference_samples
from ardea.errors import ConfigError
from ardea.model import scorer_from_causal_lm
from ardea.reward import make_reward
from ardea.trainer import run


def scorer(seed: int = 0):
    model = scorer_from_causal_lm(tiny_policy(seed), pad_token_id=PAD)
    with torch.no_grad():  # a head that is not zero, so that scores differ
        model.score.weight.copy_(
            torch.randn(model.score.weight.shape, generator=torch.Generator().manual_seed(seed))
        )
    return model


def pair_batch() -> TrajectoryBatch:
    rows = random_rows([7, 5, 6, 9], seed=3)  # chosen 0, 1 then rejected 0, 1
    return TrajectoryBatch.from_tensors(
        pad_rows(rows, PAD),
        pad_rows([[1] * len(r) for r in rows]),
        pad_rows([[0] * 3 + [1] * (len(r) - 3) for r in rows]).bool(),
        rewards=torch.tensor([1.0, 1.0, 0.0, 0.0]),
        group_ids=torch.tensor([0, 1, 0, 1]),
    )


def scores_by_hand(model, batch) -> torch.Tensor:
    """``w . h[last real token]`` from the backbone's final hidden states."""
    hidden = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    last = batch.attention_mask.sum(-1) - 1  # right padding
    h = hidden.last_hidden_state[torch.arange(batch.rows), last]  # (N, H)
    return h @ model.score.weight[0]


def test_a_fresh_scorer_is_the_policy_backbone_under_a_zero_head():
    policy = tiny_policy()
    ids = torch.tensor([random_rows([6], seed=1)[0]])
    expected = policy.model(input_ids=ids).last_hidden_state
    model = scorer_from_causal_lm(policy, pad_token_id=PAD)
    assert type(model).__name__ == "Qwen2ForSequenceClassification"
    torch.testing.assert_close(model.model(input_ids=ids).last_hidden_state, expected)
    assert model(input_ids=ids).logits.abs().max() == 0  # zero head: every score 0
    assert model.config.num_labels == 1 and model.config.pad_token_id == PAD


@pytest.mark.parametrize(("margin", "center"), [(0.0, 0.0), (0.5, 0.1)])
def test_the_loss_is_bradley_terry_on_the_scores(margin, center):
    model = scorer()
    strategy = build("reward_model", model, rm_margin=margin, rm_center_coef=center)
    batch = pair_batch()
    loss, metrics = strategy.loss(batch, strategy.step_counts([batch]))
    with torch.no_grad():
        r = scores_by_hand(model, batch).double()
    rw, rl = r[:2], r[2:]
    expected = (-F.logsigmoid(rw - rl - margin) + center * (rw + rl) ** 2).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert metrics["train/rm_accuracy"] == pytest.approx(float((rw > rl).double().mean()))
    assert metrics["train/rm_margin"] == pytest.approx(float((rw - rl).mean()), rel=1e-5)
    loss.backward()  # the head and the backbone both learn
    assert model.score.weight.grad.abs().sum() > 0
    assert model.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0


def test_task_pairs_are_the_right_answer_against_a_wrong_one():
    task = make_task("arithmetic", digits=3, reverse=True)
    examples = task.examples("train", 400)
    first = task_preference_samples(
        task, "train", 400, TOKENIZER, max_length=64, chat_template=False
    )
    again = task_preference_samples(
        task, "train", 400, TOKENIZER, max_length=64, chat_template=False
    )
    assert first == again  # the same pairs on every call
    dropped = 0
    for example, sample in zip(examples, first):
        chosen = TOKENIZER.decode(sample.chosen_ids, skip_special_tokens=True)
        rejected = TOKENIZER.decode(sample.rejected_ids, skip_special_tokens=True)
        assert task.score(chosen, example) == 1.0 and task.score(rejected, example) == 0.0
        a, b = example.meta["a"], example.meta["b"]
        dropped += rejected == str(a + b)[1:][::-1] and a + b >= 1000  # the carry left out
    assert dropped > 20  # the demonstrator's mistake is among the wrong answers
    with pytest.raises(ConfigError, match="countdown.*no built-in preference pairs"):
        task_preference_samples(
            make_task("countdown"), "train", 2, TOKENIZER, max_length=64, chat_template=False
        )


RUN = [
    *SMALL_OVERRIDES,
    "algo.name=reward_model",
    "data.task=arithmetic",
    "data.task_args={digits: 2}",
    "data.train_size=256",
    "data.eval_size=64",
    "trainer.max_steps=12",
    "trainer.batch_size=16",
    "trainer.lr=3e-3",
    "trainer.eval_every=6",
    "trainer.num_threads=1",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.report=false",  # no report.png: half a second a run
]


def test_a_run_saves_a_reward_model_that_scores_as_it_was_trained(tmp_path):
    results = run(load_config(None, [*RUN, f"trainer.output_dir={tmp_path / 'rm'}"]))
    assert results["rm_accuracy_initial"] == 0.0  # the zero head ties every pair
    assert 0.0 < results["rm_accuracy"] <= 1.0
    assert "accuracy" not in results  # nothing generates in a reward model's run
    logged = [json.loads(line) for line in (tmp_path / "rm" / "metrics.jsonl").open()]
    assert any("train/rm_accuracy" in row for row in logged)
    path = results["checkpoint"]
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    assert model.config.num_labels == 1
    task = make_task("arithmetic", digits=2)
    examples = task.examples("test", 6)
    samples = task_preference_samples(
        task, "test", 6, TOKENIZER, max_length=64, chat_template=False
    )
    batch = build("reward_model", model).collate(samples)
    with torch.no_grad():
        trained = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, 0]
    rejected = [TOKENIZER.decode(s.rejected_ids, skip_special_tokens=True) for s in samples]
    completions = [e.answer for e in examples] + rejected
    prompts = [e.prompt for e in examples] * 2
    scored = make_reward("reward_model", path=path)(prompts, completions, [{}] * 12)
    torch.testing.assert_close(torch.tensor(scored), trained, atol=1e-5, rtol=1e-4)
    assert len({round(s, 4) for s in scored}) > 1


def test_a_lora_reward_model_trains_its_head_and_saves_merged(tmp_path):
    overrides = [*RUN, "trainer.max_steps=3", "trainer.eval_every=0", "model.lora_r=4"]
    results = run(load_config(None, [*overrides, f"trainer.output_dir={tmp_path / 'rm'}"]))
    model = AutoModelForSequenceClassification.from_pretrained(results["checkpoint"])
    assert model.score.weight.abs().sum() > 0  # the head is trained in full, then merged
    assert results["trainable_parameters"] < results["parameters"] / 2


def test_a_reward_model_run_resumes_exactly(tmp_path):
    """Six steps at once, or three and then three more from the checkpoint: the same
    weights bit for bit and the same metrics (constant lr: the schedule does not depend on
    where the run was told to stop)."""
    from safetensors.torch import load_file

    def train(directory, steps):
        overrides = [*RUN, "trainer.lr_schedule=constant", "trainer.warmup_steps=0",
                     "trainer.eval_every=3", "trainer.save_every=3", "logging.log_every=1",
                     f"trainer.max_steps={steps}", "trainer.resume=auto",
                     f"trainer.output_dir={directory}"]  # fmt: skip
        return run(load_config(None, overrides))

    def final(directory):
        weights = load_file(
            directory / "checkpoints" / "step_0000006" / "policy" / "model.safetensors"
        )
        rows = [json.loads(line) for line in (directory / "metrics.jsonl").open()]
        return weights, [
            {k: v for k, v in r.items() if k != "time" and not k.startswith("perf/")} for r in rows
        ]

    train(tmp_path / "once", 6)
    train(tmp_path / "twice", 3)
    train(tmp_path / "twice", 6)
    (weights, rows), (weights2, rows2) = final(tmp_path / "once"), final(tmp_path / "twice")
    assert weights.keys() == weights2.keys() and "score.weight" in weights
    assert all(weights[k].equal(weights2[k]) for k in weights)
    assert rows2 == rows


def test_dpo_trains_on_a_tasks_built_in_pairs_too(tmp_path):
    overrides = [*RUN, "algo.name=dpo", "trainer.max_steps=2", "trainer.eval_every=0"]
    results = run(load_config(None, [*overrides, f"trainer.output_dir={tmp_path / 'dpo'}"]))
    assert results["steps"] == 2 and "eval_loss" in results  # the task's held-out pairs
    assert "accuracy" in results  # a policy's run still generates for the task's accuracy


def test_reward_model_options_are_refused_elsewhere():
    with pytest.raises(ConfigError, match="algo.rm_margin / algo.rm_center_coef.*algo.name=dpo"):
        load_config(None, ["algo.name=dpo", "algo.rm_margin=0.5"])
    assert load_config(None, ["algo.name=reward_model", "algo.rm_margin=0.5"]).algo.rm_margin == 0.5
