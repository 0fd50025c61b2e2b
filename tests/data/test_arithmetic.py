"""The arithmetic task: deterministic, disjoint splits and exact scoring."""

import pytest

from ardea.data import make_task, reward_row, task_names
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


def test_reverse_writes_every_number_least_significant_digit_first():
    task = make_task("arithmetic", digits=3, ops="+-", seed=1, reverse=True)
    plain = make_task("arithmetic", digits=3, ops="+-", seed=1)
    for example, same in zip(task.examples("train", 300), plain.examples("train", 300)):
        a, op, b = example.meta["a"], example.meta["op"], example.meta["b"]
        assert (a, op, b) == (same.meta["a"], same.meta["op"], same.meta["b"])  # same problems
        assert example.prompt == f"{a:03d}"[::-1] + op + f"{b:03d}"[::-1] + "="
        value = a + b if op == "+" else a - b
        written = example.answer.lstrip("-")[::-1]
        assert int(written) == abs(value) and example.answer.startswith("-") == (value < 0)
    # by hand: 347+589=936, 45+985=1030, 12-340=-328
    assert task.prompt(347, "+", 589) == "743+985=" and task.number(936) == "639"
    assert task.prompt(45, "+", 985) == "540+589=" and task.number(1030) == "0301"
    assert task.prompt(12, "-", 340) == "210-043=" and task.number(-328) == "-823"


@pytest.mark.parametrize("reverse", [False, True])
def test_a_sloppy_demonstrator_drops_the_top_carry_from_demonstrations_only(reverse):
    rate = 0.75
    task = make_task("arithmetic", digits=3, seed=2, reverse=reverse, drop_carry=rate)
    train = task.examples("train", 4000)
    assert [(e.prompt, e.answer) for e in train] == [  # the same problems and answers
        (e.prompt, e.answer)
        for e in make_task("arithmetic", digits=3, seed=2, reverse=reverse).examples("train", 4000)
    ]
    # a carry out of the top place: the sum has a digit more than the larger operand
    carries = [
        e
        for e in train
        if len(str(e.meta["a"] + e.meta["b"])) > len(str(max(e.meta["a"], e.meta["b"])))
    ]
    assert all(
        e.demonstration is None and e.demonstrated == e.answer for e in train if e not in carries
    )
    dropped = [e for e in carries if e.demonstration is not None]
    for e in dropped:  # 985+45=1030 demonstrated as 030 (reversed: 030)
        correct = str(e.meta["a"] + e.meta["b"])
        assert e.demonstration == (correct[1:][::-1] if reverse else correct[1:])
        assert e.demonstrated == e.demonstration and task.score(e.answer, e) == 1.0
        assert task.score(e.demonstration, e) == 0.0  # the verifier checks the answer
        # reward functions see the problem and its correct answer, not the demonstration
        assert reward_row(e) == {"prompt": e.prompt, "answer": e.answer, "meta": e.meta}
    # about half of the sums carry out; the demonstrator drops 3 in 4 of those (4 SE)
    assert 0.45 < len(carries) / len(train) < 0.55
    se = (rate * (1 - rate) / len(carries)) ** 0.5
    assert abs(len(dropped) / len(carries) - rate) < 4 * se
    assert all(e.demonstration is None for e in task.examples("test", 500))


def test_sft_trains_on_the_demonstration():
    from ardea.data.sft import tokenize_examples
    from ardea.data.tasks import Example
    from ardea.model.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    wrong, right = Example("540+589=", "0301", demonstration="030"), Example("1+1=", "2")
    samples = tokenize_examples(tokenizer, [wrong, right], max_length=64)
    for sample, text in zip(samples, ["030", "2"]):
        trained = [t for t, m in zip(sample.input_ids, sample.loss_mask) if m]
        assert tokenizer.decode(trained, skip_special_tokens=True) == text


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
    "kwargs",
    [
        {"digits": 0},
        {"digits": 10},
        {"ops": "/"},
        {"ops": ""},
        {"test_fraction": 1.0},
        {"reverse": "yes"},
        {"drop_carry": 1.5},
        {"drop_carry": -0.1},
        {"drop_carry": True},
    ],
)
def test_bad_arguments(kwargs):
    with pytest.raises(ConfigError, match="data.task_args"):
        make_task("arithmetic", **kwargs)
