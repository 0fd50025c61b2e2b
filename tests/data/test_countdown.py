"""The countdown task: safe parsing, exact scoring, a solver whose answers score 1, splits."""

import re
from fractions import Fraction

import pytest

from ardea.data import Example, make_task, task_names
from ardea.data.tasks.countdown import check_expression, parse_prompt, solve
from ardea.errors import ConfigError

NUMBERS, TARGET = [3, 7, 25, 50], 82


def reference_value(expression: str) -> Fraction:
    """Independent evaluation of a trusted solver answer: literals as Fractions."""
    assert re.fullmatch(r"[0-9+\-*/()]+", expression)
    return eval(re.sub(r"(\d+)", r"Fraction(\1)", expression), {"Fraction": Fraction})


def test_registered_with_explicit_arguments():
    assert "countdown" in task_names()
    with pytest.raises(ConfigError, match=r"unknown argument.*digits.*allowed: count, max_number"):
        make_task("countdown", digits=2)


@pytest.mark.parametrize(
    "text",
    ["7+3*25", " 7 + 3 * 25\n", "(7+3*25)", "3*25+7", "50+25+7", "(50-25)*3+7", "25*3+7"],
)
def test_accepts_correct_solutions(text):
    assert check_expression(text, NUMBERS, TARGET)


def test_accepts_exact_fraction_intermediates():
    # 6 / (1 - 3/4) = 6 / (1/4) = 24: only right with exact fractions
    assert check_expression("6/(1-3/4)", [1, 3, 4, 6], 24)
    assert not check_expression("6/(1-3/4)", [1, 3, 4, 6], 23)


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "__import__('os')",
        "abs(82)",
        "x+82",
        "7+3*25;1",
        "3**2+73",
        "7+3*25.0",
        "7+3*25+0",  # 0 is not given
        "25+25+25+7",  # 25 reused
        "7+3*25=82",
        "-(-82)",
        "+82",
        "82",  # not a given number
        "7+3*(25",
        "50//1+32",
        "0x52",
        "1_0",
        "",
        "   ",
        "(" * 150 + "7+3*25" + ")" * 150,  # too long / too deep
        "7+3*25 " + "+0*0" * 60,
    ],
)
def test_rejects_unsafe_or_wrong_input(text):
    assert not check_expression(text, NUMBERS, TARGET)


def test_duplicates_may_be_used_as_often_as_given_and_division_by_zero_is_zero():
    assert check_expression("3+3", [3, 3, 5], 6)
    assert not check_expression("3+3+3", [3, 3, 5], 9)
    assert not check_expression("5/(3-3)", [3, 3, 5], 1)


def test_solver_finds_the_shortest_expression_or_none():
    assert solve([2, 3], 6) == "2*3"
    assert solve([2, 3], 7) is None  # 2+3, 3-2, 2*3, 3/2, 2/3: none is 7
    assert solve([2, 3, 50], 6) == "2*3"
    assert solve(NUMBERS, TARGET) == "7+3*25"
    assert reference_value(solve([4, 19, 35, 45], 1)) == 1


def test_prompts_answers_and_meta():
    task = make_task("countdown", count=4, max_number=50, max_target=100, seed=1)
    for example in task.examples("train", 300):
        numbers, target = example.meta["numbers"], example.meta["target"]
        assert example.prompt == f"{' '.join(map(str, numbers))} -> {target}:"
        assert parse_prompt(example.prompt) == (numbers, target)
        assert numbers == sorted(set(numbers)) and len(numbers) == 4
        assert 1 <= min(numbers) and max(numbers) <= 50
        assert 1 <= target <= 100 and target not in numbers
        used = [int(n) for n in re.findall(r"\d+", example.answer)]
        assert not set(used) - set(numbers) and len(used) == len(set(used))
        assert reference_value(example.answer) == target


@pytest.mark.parametrize("kwargs", [{"count": 3}, {"count": 4, "min_ops": 2}, {"count": 5}])
def test_solver_answers_always_score_one(kwargs):
    task = make_task("countdown", seed=2, **kwargs)
    examples = task.examples("train", 200) + task.examples("test", 100)
    assert all(task.score(e.answer, e) == 1.0 for e in examples)
    assert all(task.score(e.answer + "+1", e) == 0.0 for e in examples)


def test_min_ops_makes_problems_harder():
    task = make_task("countdown", count=4, min_ops=3, seed=0)
    for example in task.examples("train", 20):
        assert len(re.findall(r"\d+", example.answer)) == 4


def test_score_reads_the_prompt_when_meta_is_missing():
    task = make_task("countdown")
    assert task.score("7+3*25", Example("3 7 25 50 -> 82:", "")) == 1.0
    assert task.score("7+3*25", Example("3 7 25 50 -> 81:", "")) == 0.0
    with pytest.raises(ValueError, match="neither meta"):
        task.score("1", Example("what?", ""))


def test_splits_are_deterministic_and_disjoint():
    task = make_task("countdown", seed=3)
    train = task.examples("train", 1000)
    test = task.examples("test", 200)
    assert train == make_task("countdown", seed=3).examples("train", 1000)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert len({e.prompt for e in test}) == 200
    assert task.examples("test", 50) == test[:50]
    assert make_task("countdown", seed=4).examples("test", 200) != test


def test_too_many_heldout_problems_is_an_error():
    task = make_task("countdown", count=2, max_number=3, max_target=6)
    with pytest.raises(ConfigError, match="distinct held-out countdown problems"):
        task.examples("test", 50)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"count": 1},
        {"count": 6},
        {"max_number": 3},
        {"max_target": 0},
        {"min_ops": 0},
        {"min_ops": 4},
        {"test_fraction": 0.0},
    ],
)
def test_bad_arguments(kwargs):
    with pytest.raises(ConfigError, match="data.task_args"):
        make_task("countdown", **kwargs)
