"""pass@k, avg@n, maj@k and their standard errors from sampled completions, by hand and
against an independent count on a real engine's samples."""

import math
from collections import Counter
from fractions import Fraction

import pytest
from tiny_models import small_model

from ardea.config import load_config
from ardea.data import Example, Task, make_task
from ardea.data.tasks.math_jsonl import MathJsonlTask
from ardea.errors import ArdeaError, ConfigError
from ardea.rollout.engines.inprocess.engine import InProcessEngine
from ardea.trainer.evaluate import (
    SampledEval,
    evaluate_task,
    extracts_answers,
    majority_at_k,
    pass_at_k,
    sampled_metrics,
)


def test_pass_at_k_by_hand():
    """n = 4 samples, c right: pass@2 = 1 - C(4-c, 2) / C(4, 2) = 1 - C(4-c, 2) / 6."""
    assert [pass_at_k(4, c, 2) for c in range(5)] == pytest.approx([0, 0.5, 5 / 6, 1, 1])
    assert pass_at_k(4, 1, 1) == 0.25  # pass@1 is c / n
    with pytest.raises(ValueError, match="pass@k needs 0 <= c <= n and 1 <= k <= n"):
        pass_at_k(4, 5, 2)


def test_avg_and_pass_at_k_with_standard_errors_by_hand():
    """Three prompts with 0, 2 and 4 right of 4 samples, k = 2. avg@4: values 0, 0.5, 1,
    mean 0.5, sample std 0.5, se 0.5 / sqrt(3) = 0.2886751. pass@2: values 0, 5/6, 1, mean
    11/18 = 0.6111111, sample variance ((11/18)^2 + (4/18)^2 + (7/18)^2) / 2 = 93/324,
    se sqrt(93 / 324 / 3) = 0.3093202."""
    metrics = sampled_metrics([0, 2, 4], n=4, k=2)
    assert metrics["avg@4"] == pytest.approx(0.5)
    assert metrics["avg@4_se"] == pytest.approx(0.5 / math.sqrt(3))
    assert metrics["pass@2"] == pytest.approx(11 / 18)
    assert metrics["pass@2_se"] == pytest.approx(math.sqrt(93 / 324 / 3))
    assert math.sqrt(93 / 324 / 3) == pytest.approx(0.3093202, abs=1e-7)
    alone = sampled_metrics([3], n=4, k=2)  # one prompt: no spread to estimate
    assert alone == {"avg@4": 0.75, "pass@2": 1.0}


def test_majority_at_k_by_hand():
    """n = 4: one group of 4 or two of 2, in sample order; ties go to the answer given
    first; samples without an answer do not vote; a remainder is left out."""
    answers, scores = ["5", "6", "5", "7"], [1.0, 0.0, 1.0, 0.0]
    assert majority_at_k(answers, scores, 4) == 1.0  # "5" twice
    assert majority_at_k(answers, scores, 2) == 1.0  # "5" first in both ties
    answers, scores = [None, "3", "4", "4"], [0.0, 1.0, 0.0, 0.0]
    assert majority_at_k(answers, scores, 4) == 0.0  # "4" twice beats "3" once
    assert majority_at_k(answers, scores, 2) == 0.5  # "3" alone votes; then "4"
    assert majority_at_k([None, None], [0.0, 0.0], 2) == 0.0
    assert majority_at_k(["1", "2", "2", "9", "1"], [1, 0, 0, 0, 1], 2) == 0.5  # 5th left out
    with pytest.raises(ValueError, match="1 <= k <= n"):
        majority_at_k(["1"], [1.0], 2)


def test_majority_in_the_sampled_metrics_with_its_standard_error():
    """maj@2 values 1, 0.5, 0: mean 0.5, sample variance 0.25, se sqrt(0.25 / 3)."""
    metrics = sampled_metrics([0, 2, 4], n=4, k=2, majority=[1.0, 0.5, 0.0])
    assert metrics["maj@2"] == pytest.approx(0.5)
    assert metrics["maj@2_se"] == pytest.approx(math.sqrt(0.25 / 3))
    assert "maj@2" not in sampled_metrics([0, 2, 4], n=4, k=2)


def test_each_task_extracts_the_answer_its_verifier_reads():
    arithmetic = make_task("arithmetic", digits=2)
    example = arithmetic.examples("test", 1)[0]
    assert arithmetic.extract_answer(f"  {example.answer} \n", example) == example.answer
    assert arithmetic.extract_answer("   ", example) is None
    countdown = make_task("countdown")
    example = countdown.examples("test", 1)[0]
    assert countdown.extract_answer(" (3 + 7) * 2 ", example) == "(3+7)*2"
    numeric = Example("q", "1234")
    assert MathJsonlTask.extract_answer(None, "so 1,234 apples", numeric) == Fraction(1234)
    assert MathJsonlTask.extract_answer(None, "no number", numeric) is None
    symbolic = Example("q", "\\frac{1}{2}")
    assert MathJsonlTask.extract_answer(None, "so \\boxed{\\frac{1}{2}}", symbolic) == "1/2"
    assert extracts_answers(arithmetic) and extracts_answers(countdown)


class _Plain(Task):
    name = "plain"

    def examples(self, split, n):
        return [Example("1+1=", "2")] * n

    def score(self, completion, example):
        return float(completion.strip() == example.answer)


def test_evaluate_task_on_a_real_engine_against_an_independent_count(tokenizer):
    """The in-process engine on a tiny model, 3 arithmetic prompts, 4 samples each at
    temperature 1: avg@4, pass@2 and maj@2 recomputed here from the same samples (the engine
    is seeded), with plain Counter votes; a task without answer extraction gets no maj@k."""
    task = make_task("arithmetic", digits=1)
    examples = task.examples("test", 3)
    engine = InProcessEngine(
        small_model(tokenizer, seed=3), pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=tokenizer.eos_token_id, tokenizer=tokenizer,
    )  # fmt: skip
    sampled = SampledEval(n=4, k=2, temperature=1.0, max_new_tokens=3, seed=5)
    result = evaluate_task(engine, tokenizer, task, examples, max_new_tokens=3, sampled=sampled)
    prompts = [tokenizer.encode(e.prompt, add_special_tokens=False) for e in examples]
    outs = engine.generate(prompts, sampled.params())
    texts = [tokenizer.decode(o.token_ids, skip_special_tokens=True) for o in outs]
    avg, passes, majority = [], [], []
    for i, example in enumerate(examples):
        group = texts[4 * i : 4 * i + 4]
        right = [t.strip() == example.answer for t in group]
        avg.append(sum(right) / 4)
        passes.append(1 - math.comb(4 - sum(right), 2) / math.comb(4, 2))
        wins = []
        for pair in (group[:2], group[2:]):
            voted = [t.strip() for t in pair if t.strip()]
            if not voted:
                wins.append(0)
                continue
            top = max(Counter(voted).values())
            winner = next(v for v in voted if Counter(voted)[v] == top)
            wins.append(winner == example.answer)
        majority.append(sum(wins) / 2)
    assert result.metrics["avg@4"] == pytest.approx(sum(avg) / 3)
    assert result.metrics["pass@2"] == pytest.approx(sum(passes) / 3)
    assert result.metrics["maj@2"] == pytest.approx(sum(majority) / 3)
    plain = evaluate_task(engine, tokenizer, _Plain(), examples[:1], max_new_tokens=3,
                          sampled=sampled)  # fmt: skip
    assert "avg@4" in plain.metrics and "maj@2" not in plain.metrics


def test_sampling_settings_are_checked():
    with pytest.raises(ArdeaError, match="1 <= k <= n samples, got k=5, n=4"):
        SampledEval(n=4, k=5, temperature=1.0)
    with pytest.raises(ArdeaError, match="temperature is 0"):
        SampledEval(n=4, k=2, temperature=0.0)
    with pytest.raises(ConfigError, match="trainer.eval_k=2 needs sampled completions"):
        load_config(None, ["trainer.eval_k=2"])
    with pytest.raises(ConfigError, match="trainer.eval_k"):
        load_config(None, ["trainer.eval_samples=2", "trainer.eval_k=3"])
