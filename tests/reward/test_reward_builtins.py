"""The built-in reward functions on hand-made cases (expected values written by hand)."""

import pytest

from ardea.data import Example, make_task
from ardea.errors import ConfigError
from ardea.reward import example_row, has_boxed, make_reward, task_reward


def run(name, completions, answers, **kwargs):
    fn = make_reward(name, **kwargs)
    rows = [{"answer": a} for a in answers]
    return fn(["q"] * len(completions), completions, rows)


def test_exact_match_strips_whitespace():
    got = run("exact_match", ["42", " 42\n", "042", "42.0", ""], ["42", "42", "42", "42", ""])
    assert got == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert run("exact_match", ["7"], [7]) == [1.0]  # a non-string answer is compared as text


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("The answer is 1,234.", "1234", 1.0),
        ("1234", "1,234", 1.0),
        ("It is -3", "-3", 1.0),
        ("5-3 = 2", "2", 1.0),  # the minus of 5-3 is an operator: the last number is 2
        ("5-3", "-3", 0.0),
        ("cost: 2.50 dollars", "2.5", 1.0),
        ("first 7, then 8", "7", 0.0),  # the last number counts
        ("no number here", "3", 0.0),
        ("42", 42, 1.0),
        ("0.5", "1/2", None),  # the reference is not a plain number: no opinion
    ],
)
def test_numeric_match(completion, answer, expected):
    assert run("numeric_match", [completion], [answer]) == [expected]


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        (r"so the answer is \boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"\boxed{\frac12}", "$0.5$", 1.0),
        (r"\boxed{2^{1/2}}", r"\sqrt{2}", 1.0),
        (r"\boxed{1+x^2}", "x^2+1", 1.0),
        (r"\boxed{42}", "42", 1.0),
        (r"\boxed{\frac{1}{3}}", "0.5", 0.0),
        ("I do not know", "42", 0.0),
        (r"\boxed{1}", "", None),  # an empty reference cannot be parsed: no opinion
    ],
)
def test_math_verify(completion, answer, expected):
    assert run("math_verify", [completion], [answer]) == [expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"The answer is \boxed{3}.", True),
        (r"\boxed{\frac{1}{2}}", True),
        (r"\boxed{}", False),
        (r"\boxed{  }", False),
        (r"\boxed{3", False),
        ("boxed{3}", False),
        (r"\boxed{} then \boxed{x}", True),
    ],
)
def test_format_boxed(text, expected):
    assert has_boxed(text) is expected
    assert run("format_boxed", [text], [""]) == [float(expected)]


def test_format_regex_search_full_and_flags():
    texts = ["#### 42", "answer #### 42", "#### ABC", "x\n#### 7"]
    assert run("format_regex", texts, [""] * 4, pattern=r"#### \d+$") == [1.0, 1.0, 0.0, 1.0]
    assert run("format_regex", texts, [""] * 4, pattern=r"#### \d+", full=True) == [
        1.0,
        0.0,
        0.0,
        0.0,
    ]
    assert run("format_regex", texts, [""] * 4, pattern=r"#### [a-z]+", flags="i") == [
        0.0,
        0.0,
        1.0,
        0.0,
    ]
    assert run("format_regex", ["a\nb"], [""], pattern="a.b", full=True, flags="s") == [1.0]


def test_format_regex_arguments_are_checked_when_bound():
    with pytest.raises(ConfigError, match="needs the argument.*pattern"):
        make_reward("format_regex")
    with pytest.raises(ConfigError, match="not a valid regex"):
        make_reward("format_regex", pattern="(unclosed")
    with pytest.raises(ConfigError, match="flags='x'"):
        make_reward("format_regex", pattern="a", flags="x")
    with pytest.raises(ConfigError, match=r"unknown argument\(s\) patern.*allowed: pattern"):
        make_reward("format_regex", patern="a")
    with pytest.raises(ConfigError, match=r"unknown argument\(s\) scale.*allowed: \(none\)"):
        make_reward("exact_match", scale=2)


def test_task_reward_delegates_to_the_task():
    task = make_task("arithmetic", digits=2, seed=0)
    examples = task.examples("test", 3)
    fn = task_reward(task)
    assert fn.__name__ == "task"
    rows = [example_row(e) for e in examples]
    assert rows[0] == {
        "prompt": examples[0].prompt,
        "answer": examples[0].answer,
        "meta": examples[0].meta,
    }
    completions = [examples[0].answer, " " + examples[1].answer, examples[2].answer + "1"]
    assert fn([e.prompt for e in examples], completions, rows) == [1.0, 1.0, 0.0]


def test_task_reward_uses_the_prompt_when_the_row_has_only_an_answer():
    task = make_task("countdown", seed=0)
    fn = task_reward(task)
    # no meta: countdown reads its numbers and target from the prompt
    assert fn(
        ["3 7 25 50 -> 82:", "3 7 25 50 -> 82:"],
        ["7+3*25", "7+25*3+0"],
        [
            {"answer": "7+3*25"},
            {"answer": "7+3*25"},
        ],
    ) == [1.0, 0.0]
    with pytest.raises(ConfigError, match="needs a Task"):
        task_reward("countdown")


def test_a_row_without_answer_is_an_error():
    with pytest.raises(KeyError, match="no 'answer' field.*question"):
        run_rows = make_reward("exact_match")
        run_rows(["q"], ["1"], [{"question": "q"}])


def test_example_row_of_a_plain_example():
    assert example_row(Example("p", "a")) == {"prompt": "p", "answer": "a", "meta": {}}
