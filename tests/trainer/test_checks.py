"""Every name a config gives is resolved before any work: strategy, task, reward
functions (registered or user code by dotted path), model directory."""

import pytest

from ardea.config import load_config
from ardea.errors import ArdeaError, ConfigError
from ardea.trainer import check_config, run

ONLINE = ["algo.name=online_grpo"]


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (["algo.name=nosuch"], r"unknown strategy algo\.name='nosuch'; known strategies: dpo, "),
        (["data.task=nosuch"], r"unknown task data\.task='nosuch'; known tasks: arithmetic, "),
        (["data.task_args.digit=2"], r"unknown argument\(s\) digit .*allowed: digits, ops"),
        (["data.task=math_jsonl"], r"task 'math_jsonl' needs data\.task_args\.path"),
        (["data.task_args.digits=12"], r"data\.task_args\.digits=12 must be an integer"),
        (
            ["reward.functions=[{name: nosuch}]"],
            r"reward\.functions\[0\]: unknown reward function 'nosuch'; known reward functions: exact_match, ",
        ),
        (
            [*ONLINE, "reward.functions=[{name: task}, {name: format_regex}]"],
            r"reward\.functions\[1\]: reward function 'format_regex' needs the argument\(s\) pattern",
        ),
        (
            ["reward.functions=[{name: ardea_no_such_module.fn}]"],
            r"cannot import module 'ardea_no_such_module'",
        ),
        ([*ONLINE, "data.task=null", "data.path=x.jsonl"], r"'task' scores with data\.task"),
        (["model.path=/nonexistent/model"], r"model\.path directory /nonexistent/model does not"),
    ],
)
def test_a_name_that_resolves_to_nothing_is_one_error(overrides, pattern):
    with pytest.raises(ArdeaError, match=pattern):
        check_config(load_config(None, overrides))


def test_what_a_strategy_does_not_read_may_stay_unresolvable(tmp_path):
    # SFT never scores: a 'task' reward without a task is no error there, but is online
    config = load_config(None, ["data.task=null", f"data.path={tmp_path / 'x.jsonl'}"])
    check_config(config)
    check_config(load_config(None, ["model.path=/nonexistent"]), model_path=False)


def test_user_reward_functions_are_imported_and_checked(write_reward_module):
    write_reward_module(
        "ardea_check_rewards",
        "def length(prompts, completions, rows, *, cap):\n    return [0.0] * len(completions)\n",
    )
    named = "reward.functions=[{name: ardea_check_rewards.length, kwargs: {cap: 3}}]"
    check_config(load_config(None, [*ONLINE, named]))
    with pytest.raises(ConfigError, match=r"needs the argument\(s\) cap"):
        check_config(load_config(None, [*ONLINE, named.replace(", kwargs: {cap: 3}", "")]))
    with pytest.raises(ConfigError, match=r"module 'ardea_check_rewards' has no 'width'"):
        check_config(load_config(None, [named.replace("length", "width")]))


def test_a_single_run_fails_before_its_directory_is_made(tmp_path):
    config = load_config(
        None, ["reward.functions=[{name: nosuch}]", f"trainer.output_dir={tmp_path / 'r'}"]
    )
    with pytest.raises(ConfigError, match="unknown reward function 'nosuch'"):
        run(config)
    assert not (tmp_path / "r").exists()
