"""The arithmetic task: deterministic, disjoint splits and exact scoring."""

import pytest

from ardea.data import make_task, task_names
from ardea.errors import ConfigError


def test_registry_lists_arithmetic_and_rejects_unknown():
    assert "arithmetic" in task_names()
    with pytest.raises(
        ConfigError, match="unknown task data.task='algebra'; known tasks: .*arithmetic"
    ):
        make_task("algebra")
    with pytest.raises(ConfigError, match="unknown argument.*depth.*allowed: digits, ops"):
        make_task("arithmetic", depth=2)


def test_answers_are_correct_and_prompts_well_formed():
    task = make_task("arithmetic", digits=3, ops="+-*", seed=1)
    for example in task.examples("train", 300):
        a, op, b = example.meta["a"], example.meta["op"], example.meta["b"]
        assert example.prompt == f"{a}{op}{b}="
        assert int(example.answer) == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert 0 <= a < 1000 and 0 <= b < 1000


def test_splits_are_deterministic_and_disjoint():
    task = make_task("arithmetic", digits=2, seed=3)
    train = task.examples("train", 2000)
    test = task.examples("test", 300)
    assert train == make_task("arithmetic", digits=2, seed=3).examples("train", 2000)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert len({e.prompt for e in test}) == 300  # held-out problems are unique
    # the held-out split does not depend on how many training examples were asked for
    assert task.examples("test", 100) == test[:100]
    assert make_task("arithmetic", digits=2, seed=4).examples("test", 300) != test


def test_too_many_heldout_examples_is_an_error():
    with pytest.raises(ConfigError, match="held-out examples"):
        make_task("arithmetic", digits=1).examples("test", 50)


def test_score_is_exact_match_after_whitespace():
    task = make_task("arithmetic")
    example = task.examples("test", 1)[0]
    assert task.score(example.answer, example) == 1.0
    assert task.score(f" {example.answer}\n", example) == 1.0
    assert task.score(example.answer + "0", example) == 0.0
    assert task.score("", example) == 0.0


@pytest.mark.parametrize(
    "kwargs", [{"digits": 0}, {"digits": 10}, {"ops": "/"}, {"ops": ""}, {"test_fraction": 1.0}]
)
def test_bad_arguments(kwargs):
    with pytest.raises(ConfigError, match="data.task_args"):
        make_task("arithmetic", **kwargs)
