"""The math_jsonl task: GSM8K-style files, splits, scoring, and one clear line per bad file."""

import json
from pathlib import Path

import pytest

from ardea.data import Example, make_task, task_names
from ardea.data.tasks.math_jsonl import final_answer
from ardea.errors import ArdeaError, ConfigError

MINI = Path(__file__).resolve().parents[2] / "examples" / "data" / "gsm8k_mini.jsonl"


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def problems(n, start=0):
    return [
        {"question": f"What is {i} plus 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
        for i in range(start, start + n)
    ]


def test_final_answer():
    assert final_answer("3 + 4 = 7\n#### 7") == "7"
    assert final_answer("a #### 1 #### 1,234 ") == "1,234"
    assert final_answer("  \\frac{1}{2} ") == "\\frac{1}{2}"


def test_the_shipped_example_file():
    assert "math_jsonl" in task_names()
    lines = [json.loads(line) for line in MINI.read_text().splitlines()]
    assert len(lines) == 60 and len({r["question"] for r in lines}) == 60
    task = make_task("math_jsonl", path=str(MINI))
    train, test = task.examples("train", 54), task.examples("test", 6)
    assert len({e.prompt for e in train}) == 54  # 10% of 60 questions are held out
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    for example in train + test:
        assert (
            example.prompt == example.meta["question"] + "\nEnd your answer with the final number."
        )
        assert example.meta["solution"].endswith("#### " + example.answer)
        assert task.score(f"The answer is {example.answer}.", example) == 1.0
        assert task.score(example.meta["solution"], example) == 1.0


def test_splits_are_deterministic_and_seeded(tmp_path):
    path = write(tmp_path / "p.jsonl", problems(40))
    task = make_task("math_jsonl", path=path, test_fraction=0.25, seed=1)
    test = task.examples("test", 10)
    train = task.examples("train", 30)
    assert len({e.prompt for e in test}) == 10 and len({e.prompt for e in train}) == 30
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert task.examples("test", 4) == test[:4]
    assert (
        make_task("math_jsonl", path=path, test_fraction=0.25, seed=1).examples("test", 10) == test
    )
    other = make_task("math_jsonl", path=path, test_fraction=0.25, seed=2).examples("test", 10)
    assert {e.prompt for e in other} != {e.prompt for e in test}
    # the split does not depend on the order of the file
    shuffled = write(tmp_path / "r.jsonl", problems(40)[::-1])
    reversed_test = make_task("math_jsonl", path=shuffled, test_fraction=0.25, seed=1)
    assert {e.prompt for e in reversed_test.examples("test", 10)} == {e.prompt for e in test}


def test_train_cycles_and_test_refuses_more_than_it_has(tmp_path):
    task = make_task(
        "math_jsonl", path=write(tmp_path / "p.jsonl", problems(10)), test_fraction=0.2
    )
    train = task.examples("train", 20)
    assert len(train) == 20 and len({e.prompt for e in train}) == 8
    with pytest.raises(
        ConfigError, match="asked for 3 held-out examples.*only 2; lower data.eval_size"
    ):
        task.examples("test", 3)
    with pytest.raises(ConfigError, match="unknown split"):
        task.examples("valid", 1)


def test_test_path_and_instruction(tmp_path):
    train_path = write(tmp_path / "train.jsonl", problems(5))
    test_path = write(tmp_path / "test.jsonl", problems(3, start=100))
    task = make_task("math_jsonl", path=train_path, test_path=test_path, instruction="")
    assert sorted(e.prompt for e in task.examples("test", 3)) == [
        "What is 100 plus 1?",
        "What is 101 plus 1?",
        "What is 102 plus 1?",
    ]
    assert {e.answer for e in task.examples("train", 5)} == {"1", "2", "3", "4", "5"}
    with pytest.raises(
        ConfigError, match="test_fraction and data.task_args.test_path are both set"
    ):
        make_task("math_jsonl", path=train_path, test_path=test_path, test_fraction=0.5)


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("so 12 * 100 = 1,200", "1200", 1.0),
        ("1200", "1,200", 1.0),
        ("it is -6 degrees", "-6", 1.0),
        ("4.50 dollars", "4.5", 1.0),
        ("#### 7\nno wait, 8", "7", 0.0),  # the last number counts
        ("no idea", "7", 0.0),
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),  # a non-numeric gold goes through math-verify
        (r"\boxed{\frac{1}{3}}", r"\frac{1}{2}", 0.0),
    ],
)
def test_score(completion, gold, expected):
    task = make_task("math_jsonl", path=str(MINI))
    assert task.score(completion, Example("q", gold)) == expected


def test_numeric_answers_in_json(tmp_path):
    path = write(tmp_path / "n.jsonl", [{"question": f"q{i}", "answer": i} for i in range(5)])
    task = make_task("math_jsonl", path=path, test_fraction=0.2)
    answers = [e.answer for e in task.examples("train", 4) + task.examples("test", 1)]
    assert sorted(answers) == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize(
    ("rows", "pattern"),
    [
        (['{"question": "q", "answer": "1"}', "{not json"], r"bad.jsonl line 2 is not valid JSON"),
        (
            [{"question": "q", "answer": "1"}, {"prompt": "q2", "answer": "2"}],
            r"bad.jsonl line 2: missing key 'question' \(keys: prompt, answer\)",
        ),
        ([{"question": "q"}], r"bad.jsonl line 1: missing key 'answer'"),
        ([{"question": "", "answer": "1"}], r"bad.jsonl line 1: 'question' must be a non-empty"),
        ([{"question": "q", "answer": ["1"]}], r"bad.jsonl line 1: 'answer' must be a string or"),
        ([{"question": "q", "answer": "work\n####  "}], r"bad.jsonl line 1: 'answer' has no final"),
        (["[1, 2]"], r"bad.jsonl line 1 is not a JSON object"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path, rows, pattern):
    path = write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ArdeaError, match=pattern) as info:
        make_task("math_jsonl", path=path)
    assert "\n" not in str(info.value)


def test_missing_empty_and_unset_files(tmp_path):
    with pytest.raises(ArdeaError, match=r"data file .*nope.jsonl does not exist"):
        make_task("math_jsonl", path=str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ArdeaError, match=r"empty.jsonl holds no records"):
        make_task("math_jsonl", path=str(tmp_path / "empty.jsonl"))
    with pytest.raises(ConfigError, match="needs data.task_args.path"):
        make_task("math_jsonl")
    one = write(tmp_path / "one.jsonl", problems(1))
    with pytest.raises(ArdeaError, match="the train split is empty"):
        make_task("math_jsonl", path=one)
    with pytest.raises(ConfigError, match="test_fraction=1.5"):
        make_task("math_jsonl", path=one, test_fraction=1.5)


def test_demonstrate_the_worked_solution(tmp_path):
    path = write(tmp_path / "p.jsonl", [*problems(9), {"question": "Bare?", "answer": "7"}])
    plain = make_task("math_jsonl", path=path, test_fraction=0.5)
    assert all(e.demonstrated == e.answer for e in plain.examples("train", 5))
    task = make_task("math_jsonl", path=path, test_fraction=0.5, demonstrate="solution")
    for example in task.examples("train", 5) + task.examples("test", 5):
        assert example.demonstrated == example.meta["solution"].strip()  # "#### n" included
        assert task.score(example.demonstrated, example) == 1.0  # and scored right
    with pytest.raises(ConfigError, match="demonstrate='steps' must be one of: answer, solution"):
        make_task("math_jsonl", path=path, demonstrate="steps")
