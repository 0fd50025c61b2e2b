"""RewardConfig (OmegaConf structured config) and build_scorer."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from ardea.config import load_config
from ardea.config.reward import RewardConfig, RewardFunctionConfig
from ardea.data import make_task
from ardea.errors import ConfigError
from ardea.reward import RewardError, build_scorer, example_row


def from_yaml(text):
    merged = OmegaConf.merge(OmegaConf.structured(RewardConfig), OmegaConf.create(text))
    return OmegaConf.to_object(merged)


def test_defaults():
    config = RewardConfig()
    assert config.functions == [RewardFunctionConfig(name="task", weight=1.0, kwargs={})]
    assert (config.timeout_s, config.on_error) == (10.0, "mask")


def test_every_field_has_help_text():
    for cls in (RewardConfig, RewardFunctionConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"


def test_yaml_with_a_list_of_functions_round_trips():
    config = from_yaml(
        "functions:\n"
        "  - {name: numeric_match}\n"
        "  - {name: format_regex, weight: 0.1, kwargs: {pattern: '#### \\d+$'}}\n"
        "timeout_s: 2.5\non_error: zero\n"
    )
    assert config == RewardConfig(
        functions=[
            RewardFunctionConfig(name="numeric_match"),
            RewardFunctionConfig(name="format_regex", weight=0.1, kwargs={"pattern": "#### \\d+$"}),
        ],
        timeout_s=2.5,
        on_error="zero",
    )
    assert OmegaConf.to_object(OmegaConf.structured(config)) == config
    assert RewardConfig(functions=[{"name": "exact_match", "weight": 2}]).functions == [
        RewardFunctionConfig(name="exact_match", weight=2)
    ]


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"functions": []}, "reward.functions is empty"),
        ({"functions": [{"name": "task"}, {"name": ""}]}, r"reward.functions\[1\]\.name=''"),
        ({"functions": [{"name": "task", "kwargs": [1]}]}, r"kwargs=\[1\] must be a mapping"),
        (
            {"functions": [{"name": "task", "weight": float("inf")}]},
            r"reward.functions\[0\]\.weight=inf must be a finite number",
        ),
        ({"timeout_s": 0.0}, r"reward.timeout_s=0.0 must be a positive"),
        ({"timeout_s": float("inf")}, r"reward.timeout_s=inf"),
        (
            {"on_error": "ignore"},
            r"reward.on_error='ignore' is not allowed.*'mask', 'zero', 'fail'",
        ),
    ],
)
def test_bad_values_name_the_field(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        RewardConfig(**kwargs)


def test_a_function_without_name_is_an_error_naming_the_entry(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("reward:\n  functions:\n    - {weight: 2.0}\n")
    with pytest.raises(ConfigError, match=r"^reward\.functions\[0\]\.name: .*missing"):
        load_config(path)


def test_build_scorer_default_scores_with_the_task():
    task = make_task("arithmetic", digits=2)
    examples = task.examples("test", 2)
    scorer = build_scorer(RewardConfig(), task)
    result = scorer.score(
        [e.prompt for e in examples],
        [examples[0].answer, "x"],
        [example_row(e) for e in examples],
    )
    assert result.rewards == [1.0, 0.0]
    assert list(result.per_function) == ["task"]


def test_build_scorer_with_weights_kwargs_and_policy():
    config = RewardConfig(
        functions=[
            {"name": "numeric_match", "weight": 1.0},
            {"name": "format_regex", "weight": 0.25, "kwargs": {"pattern": r"#### -?\d+$"}},
        ],
        timeout_s=3.0,
        on_error="zero",
    )
    scorer = build_scorer(config, None)
    assert (scorer.timeout_s, scorer.on_error, scorer.names) == (
        3.0,
        "zero",
        ["numeric_match", "format_regex"],
    )
    result = scorer.score(["q", "q"], ["so #### 12", "#### 13 apples"], [{"answer": "12"}] * 2)
    assert result.rewards == [1.25, 0.0]


@pytest.mark.parametrize(
    ("functions", "task", "pattern"),
    [
        ([{"name": "task"}], None, r"reward.functions\[0\].name='task'.*no task"),
        (
            [{"name": "task", "kwargs": {"digits": 2}}],
            "arithmetic",
            r"takes no kwargs \(got digits\)",
        ),
        (
            [{"name": "exact_match"}, {"name": "exact"}],
            None,
            r"reward.functions\[1\]: unknown reward function 'exact'",
        ),
        (
            [{"name": "format_regex", "kwargs": {"pattern": "("}}],
            None,
            r"reward.functions\[0\]: format_regex: pattern='\(' is not a valid regex",
        ),
    ],
)
def test_build_scorer_errors_name_the_entry(functions, task, pattern):
    task = make_task(task) if task else None
    with pytest.raises(ConfigError, match=pattern):
        build_scorer(RewardConfig(functions=functions), task)


def test_build_scorer_failures_follow_on_error():
    functions = [{"name": "exact_match"}]
    masked = build_scorer(RewardConfig(functions=functions, timeout_s=1.0), None)
    result = masked.score(["q"], ["1"], [{"question": "no answer here"}])  # the default: mask
    assert result.failed == [True] and "'exact_match' raised KeyError" in result.first_problem
    strict = build_scorer(RewardConfig(functions=functions, timeout_s=1.0, on_error="fail"), None)
    with pytest.raises(RewardError, match="'exact_match' raised KeyError"):
        strict.score(["q"], ["1"], [{"question": "no answer here"}])
