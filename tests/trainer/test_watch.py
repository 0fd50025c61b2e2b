"""Which evaluation is the best, and when one is a collapse (ardea.trainer.watch)."""

import pytest

from ardea.trainer.watch import best_before, collapse_warning, judge


def test_the_best_is_the_earliest_of_the_highest():
    assert best_before([]) is None
    assert best_before([[0, 0.2], [50, 0.6], [100, 0.6], [150, 0.1]]) == (50, 0.6)


@pytest.mark.parametrize(
    ("best", "value", "warns"),
    [
        (0.90, 0.46, False),  # a fall of 0.44 <= max(0.1, 0.45)
        (0.90, 0.44, True),  # 0.46 > 0.45
        (0.10, 0.00, False),  # max(0.1, 0.05) = 0.1: noise near a low value never warns
        (0.30, 0.19, False),  # 0.11 <= max(0.1, 0.15)
        (0.30, 0.14, True),  # 0.16 > 0.15
        (-2.0, -3.1, True),  # a mean reward: 1.1 > max(0.1, 1.0)
        (-2.0, -2.9, False),
    ],
)
def test_a_collapse_is_a_fall_beyond_a_tenth_or_half_the_best(best, value, warns):
    limit = max(0.1, 0.5 * abs(best))
    assert warns == (best - value > limit)  # the rule, by hand
    assert (collapse_warning("eval/x", 7, value, (3, best)) is not None) == warns


def test_the_warning_is_one_line_naming_metric_values_and_steps():
    line = collapse_warning("eval/accuracy", 300, 0.05, (200, 0.85))
    assert "\n" not in line and line.startswith("warning: eval/accuracy fell to 0.05 at step 300")
    assert "its best 0.85 at step 200" in line and "trainer.keep_best=true" in line


def test_judge_reads_the_watched_metric_of_this_step():
    history = {"eval/loss": [[0, 3.0], [10, 2.0]], "eval/reward_mean": [[0, 0.5], [10, 0.7]]}
    assert judge(history, 10) == ("eval/reward_mean", None, True)
    history["eval/accuracy"] = [[0, 0.8], [10, 0.2]]  # accuracy ranks before reward
    name, warning, improved = judge(history, 10)
    assert name == "eval/accuracy" and warning is not None and not improved
    assert judge({"eval/accuracy": [[0, 0.4]]}, 0) == ("eval/accuracy", None, True)
    assert judge({"eval/accuracy": [[0, 0.4]]}, 10) is None  # not evaluated at step 10
    assert judge({"eval/loss": [[10, 1.0]]}, 10) is None
