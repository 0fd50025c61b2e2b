"""data.task=reasoning_gym: the generators' own entries and verifiers, splits disjoint and
fixed by the seed, a weighted mix, and bad task_args named. Checked against reasoning-gym
itself (its datasets built directly), not against this task's code."""

from __future__ import annotations

import pytest
import reasoning_gym

from ardea.data.tasks import make_task
from ardea.errors import ConfigError

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


def chain_sum(**kwargs):
    return make_task("reasoning_gym", dataset="chain_sum", config=SMALL, **kwargs)


def test_examples_are_the_generators_entries_scored_by_its_verifier():
    task = chain_sum(seed=3)
    direct = reasoning_gym.create_dataset("chain_sum", size=1_000_000, seed=3, **SMALL)
    for example in task.examples("train", 20) + task.examples("test", 20):
        entry = direct[example.meta["index"]]
        assert example.prompt.startswith(entry["question"])
        assert example.prompt.endswith("<answer> and </answer>.")
        assert example.answer == entry["answer"]
        assert example.demonstrated == f"<answer>{entry['answer']}</answer>"
        assert task.score(f"thinking... <answer>{entry['answer']}</answer>", example) == 1.0
        assert task.score(f"<answer>{int(entry['answer']) + 1}</answer>", example) == 0.0
        assert task.score(entry["answer"], example) == 0.0  # untagged: no answer given
        assert (
            task.extract_answer(f"<answer> {entry['answer']} </answer>", example)
            == (entry["answer"])
        )


def test_plain_answers_are_the_whole_completion_and_partial_credit_is_asked_for():
    task = chain_sum(answer_format="plain")
    (example,) = task.examples("test", 1)
    assert example.demonstrated == example.answer and "\n" not in example.prompt
    assert task.score(f" {example.answer}\n", example) == 1.0
    near = f"{example.answer}0"  # the generator gives closeness some credit
    direct = reasoning_gym.create_dataset("chain_sum", size=1, seed=0, **SMALL)
    credit = direct.score_answer(near, direct[example.meta["index"]])
    assert 0.0 < credit < 1.0
    assert task.score(near, example) == 0.0  # a task score: right or not
    partial = chain_sum(answer_format="plain", partial_credit=True)
    assert partial.score(near, partial.examples("test", 1)[0]) == credit


def test_splits_are_disjoint_fixed_by_the_seed_and_independent_of_how_many():
    task = chain_sum(seed=1)
    train = [e.prompt for e in task.examples("train", 300)]
    test = [e.prompt for e in task.examples("test", 60)]
    assert not set(train) & set(test)
    assert len(set(test)) == len(test)  # held out without repeats
    again = chain_sum(seed=1)
    assert [e.prompt for e in again.examples("test", 10)] == test[:10]
    assert [e.prompt for e in again.examples("train", 300)] == train
    other = [e.prompt for e in chain_sum(seed=2).examples("test", 60)]
    assert other != test


def test_a_weighted_mix_draws_each_generator_in_proportion():
    task = make_task(
        "reasoning_gym",
        datasets={"chain_sum": {"weight": 3, "config": SMALL}, "gcd": {"weight": 1}},
        answer_format="plain",
    )
    examples = task.examples("train", 400)
    share = sum(e.meta["source"] == "chain_sum" for e in examples) / len(examples)
    # Binomial(400, 0.75): standard deviation 0.0217; five of them either side
    assert 0.64 < share < 0.86
    assert {e.meta["source"] for e in examples} == {"chain_sum", "gcd"}
    for example in examples[:20]:
        assert task.score(example.answer, example) == 1.0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"dataset": "no_such"}, "'no_such' is not a reasoning-gym generator; the "),
        ({"dataset": "gcd", "config": {"max_val": 9}},
         "unknown setting(s) max_val; gcd's settings: min_numbers, max_numbers, min_value"),
        ({"dataset": "chain_sum", "config": {"min_terms": 5, "max_terms": 2}},
         "data.task_args.config of 'chain_sum'"),
        ({"dataset": "gcd", "config": {"seed": 1}}, "seed is set by ardea"),
        ({}, "needs data.task_args.dataset (one generator) or data.task_args.datasets"),
        ({"dataset": "gcd", "datasets": {"gcd": {}}}, "and not both"),
        ({"datasets": {"gcd": {"weight": 0}}}, "datasets.gcd.weight=0 must be > 0"),
        ({"datasets": {"gcd": {"wieght": 2}}}, "unknown key(s) wieght; allowed: weight, config"),
        ({"dataset": "gcd", "answer_format": "xml"}, "answer_format='xml' must be one of"),
    ],
    ids=["name", "setting", "value", "seed", "none", "both", "weight", "key", "format"],
)  # fmt: skip
def test_bad_task_args_are_named(args, words):
    with pytest.raises(ConfigError) as caught:
        make_task("reasoning_gym", **args)
    assert words in str(caught.value)


def test_an_unknown_generator_lists_the_ones_reasoning_gym_has():
    with pytest.raises(ConfigError) as caught:
        make_task("reasoning_gym", dataset="no_such")
    known = sorted(n for n in reasoning_gym.factory.DATASETS if n != "composite")
    assert f"the {len(known)} known: {', '.join(known)}" in str(caught.value)


def test_too_few_distinct_questions_is_an_error_not_a_hang():
    tiny = {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 2}  # 4 questions
    task = make_task("reasoning_gym", dataset="gcd", config=tiny)
    with pytest.raises(Exception, match="too few distinct questions"):
        task.examples("test", 50)
