"""RewardScorer: weighted sums, and every failure mode under on_error=fail and zero."""

import math
import threading
import time

import pytest

from ardea.errors import ArdeaError, ConfigError
from ardea.reward import COUNT_KEYS, RewardError, RewardScorer

TIMEOUT = 0.2
PROMPTS = ["p0", "p1", "p2"]
COMPLETIONS = ["c0", "c1", "c2"]
ROWS = [{"answer": "a0"}, {"answer": "a1"}, {"answer": "a2"}]


def named(name, fn):
    fn.__name__ = name
    return fn


def const(name, values):
    return named(name, lambda prompts, completions, rows: list(values))


@pytest.fixture
def hang():
    """A reward function that blocks until the test ends (then its thread finishes)."""
    release = threading.Event()

    def hanging(prompts, completions, rows):
        release.wait(30)
        return [1.0] * len(completions)

    yield hanging
    release.set()


def score(functions, on_error="fail", **kwargs):
    scorer = RewardScorer(functions, timeout_s=TIMEOUT, on_error=on_error, **kwargs)
    return scorer.score(PROMPTS, COMPLETIONS, ROWS)


def zero_counts(**nonzero):
    counts = dict.fromkeys(COUNT_KEYS, 0)
    counts.update({f"reward/{k}": v for k, v in nonzero.items()})
    return counts


def test_weighted_sum_and_per_function_values():
    result = score([(const("a", [1.0, 0.0, 1.0]), 2.0), (const("b", [0.5, 1.0, -1.0]), -0.5)])
    assert result.rewards == [2.0 - 0.25, 0.0 - 0.5, 2.0 + 0.5]
    assert result.per_function == {"a": [1.0, 0.0, 1.0], "b": [0.5, 1.0, -1.0]}
    assert result.counts == zero_counts()


def test_inputs_reach_the_function_and_numbers_of_any_kind_are_accepted():
    seen = {}

    def spy(prompts, completions, rows):
        seen.update(prompts=prompts, completions=completions, rows=rows)
        return (True, 2, 0.5)  # a tuple of bool / int / float

    assert score([(spy, 1.0)]).rewards == [1.0, 2.0, 0.5]
    assert seen == {"prompts": PROMPTS, "completions": COMPLETIONS, "rows": ROWS}


@pytest.mark.parametrize("on_error", ["mask", "zero"])
def test_none_fails_its_sample_and_is_counted(on_error):
    result = score([(const("maybe", [None, 1.0, None]), 1.0)], on_error)
    assert result.rewards == [0.0, 1.0, 0.0]
    assert result.counts == zero_counts(skipped=2)
    assert result.failed == [True, False, True] and result.failed_by_function == {"maybe": 2}
    assert result.first_problem == "'maybe' returned None at index 0"


def test_none_under_fail_stops_naming_the_sample():
    with pytest.raises(RewardError, match=r"'maybe' returned None at index 0.*sample #0"):
        score([(const("maybe", [None, 1.0, None]), 1.0)], "fail")


def test_repeated_names_are_made_unique():
    result = score([(const("f", [1, 1, 1]), 1.0), (const("f", [0, 0, 0]), 1.0)])
    assert list(result.per_function) == ["f", "f_2"]


def raising(prompts, completions, rows):
    raise ZeroDivisionError("division by zero in my reward")


FAILURES = {
    "raises": (raising, "errors", 3, r"raised ZeroDivisionError: division by zero in my reward"),
    "nan": (const("nan", [1.0, math.nan, math.nan]), "nonfinite", 2, r"returned nan at index 1"),
    "inf": (const("inf", [-math.inf, 1.0, 1.0]), "nonfinite", 1, r"returned -inf at index 0"),
    "short": (const("short", [1.0, 1.0]), "errors", 3, r"returned 2 values for 3 completions"),
    "string": (const("string", [1.0, "1.0", 1.0]), "errors", 1, r"returned '1.0' at index 1"),
    "scalar": (named("scalar", lambda p, c, r: 1.0), "errors", 3, r"returned a float, not a list"),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_failures_zero_the_affected_samples_and_count_them(case):
    fn, kind, count, _ = FAILURES[case]
    good = const("good", [1.0, 1.0, 1.0])
    result = score([(fn, 1.0), (good, 0.5)], "zero")
    affected = {
        "raises": [0, 1, 2],
        "nan": [1, 2],
        "inf": [0],
        "short": [0, 1, 2],
        "string": [1],
        "scalar": [0, 1, 2],
    }[case]
    name = fn.__name__
    assert [i for i, v in enumerate(result.per_function[name]) if v == 0.0] == affected
    assert result.per_function["good"] == [1.0, 1.0, 1.0]
    assert result.rewards == [0.5 + (0.0 if i in affected else 1.0) for i in range(3)]
    assert result.counts == zero_counts(**{kind: count})
    assert result.failed == [i in affected for i in range(3)]
    assert result.failed_by_function == {name: len(affected), "good": 0}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_failures_raise_with_the_function_problem_and_sample(case):
    fn, _, _, pattern = FAILURES[case]
    with pytest.raises(RewardError, match=rf"reward function '{fn.__name__}' {pattern}") as info:
        score([(fn, 1.0)], "fail")
    message = str(info.value)
    first = {"nan": 1, "string": 1}.get(case, 0)
    assert f"first offending sample #{first}: prompt='p{first}' completion='c{first}'" in message
    assert "reward.on_error=mask leaves such samples out of training" in message
    assert isinstance(info.value, ArdeaError)


def test_long_samples_are_truncated_in_the_message():
    scorer = RewardScorer([(raising, 1.0)], timeout_s=TIMEOUT, on_error="fail")
    with pytest.raises(RewardError) as info:
        scorer.score(["P" * 5000], ["C" * 5000], [{}])
    assert len(str(info.value)) < 600
    assert "'PPPP" in str(info.value) and "..." in str(info.value)


def test_timeout_fail_raises_within_the_timeout(hang):
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"'hanging' did not return within timeout_s=0\.2"):
        score([(hang, 1.0)], "fail")
    assert time.monotonic() - start < TIMEOUT + 0.5


def test_timeouts_zero_and_count_and_never_stall_beyond_the_timeout(hang):
    second = named("hanging_too", lambda p, c, r: hang(p, c, r))
    good = const("good", [1.0, 0.0, 1.0])
    start = time.monotonic()
    result = score([(hang, 1.0), (second, 1.0), (good, 1.0)], "zero")
    elapsed = time.monotonic() - start
    assert elapsed < TIMEOUT + 0.5  # both hung calls share one deadline
    assert elapsed >= TIMEOUT - 0.01
    assert result.rewards == [1.0, 0.0, 1.0]
    assert result.per_function["hanging"] == [0.0, 0.0, 0.0]
    assert result.counts == zero_counts(timeouts=6)


def test_a_slow_but_finishing_function_is_kept():
    def slowish(prompts, completions, rows):
        time.sleep(0.02)
        return [1.0] * len(completions)

    assert score([(slowish, 1.0)], "fail").rewards == [1.0, 1.0, 1.0]


def test_too_many_abandoned_calls_stop_the_run(hang):
    scorer = RewardScorer([(hang, 1.0)], timeout_s=0.05, on_error="zero", max_abandoned=1)
    scorer.score(PROMPTS, COMPLETIONS, ROWS)  # 1 abandoned
    scorer.score(PROMPTS, COMPLETIONS, ROWS)  # 2 abandoned
    with pytest.raises(
        RewardError, match=r"2 timed-out reward calls \(hanging\) are still running"
    ):
        scorer.score(PROMPTS, COMPLETIONS, ROWS)


def test_empty_batch_and_mismatched_inputs():
    scorer = RewardScorer([(raising, 1.0)], timeout_s=TIMEOUT, on_error="fail")
    empty = scorer.score([], [], [])
    assert (empty.rewards, empty.per_function, empty.counts) == ([], {"raising": []}, zero_counts())
    with pytest.raises(ValueError, match="one prompt and one row per completion"):
        scorer.score(["p"], ["c", "d"], [{}, {}])


@pytest.mark.parametrize(
    ("functions", "kwargs", "pattern"),
    [
        ([], {}, "at least one"),
        ([(3, 1.0)], {}, "not callable"),
        ([(raising, math.nan)], {}, "must be finite"),
        ([(raising, "1")], {}, "must be a number"),
        ([(raising, 1.0)], {"timeout_s": 0}, "timeout_s=0"),
        ([(raising, 1.0)], {"on_error": "ignore"}, "on_error='ignore'"),
        ([(raising, 1.0)], {"max_abandoned": -1}, "max_abandoned=-1"),
    ],
)
def test_bad_constructor_arguments(functions, kwargs, pattern):
    kwargs = {"timeout_s": 1.0, **kwargs}
    with pytest.raises(ConfigError, match=pattern):
        RewardScorer(functions, **kwargs)
