"""The reward registry: names, dotted paths to user code, keyword arguments."""

import sys
import textwrap

import pytest

from ardea.errors import ArdeaError, ConfigError
from ardea.reward import get_reward, make_reward, register_reward, reward_names
from ardea.reward import registry as registry_module

BUILTINS = ["exact_match", "format_boxed", "format_regex", "math_verify", "numeric_match", "task"]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module ``my_rewards`` on sys.path with a few user reward functions."""
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            def length_bonus(prompts, completions, rows, *, per_char=0.1):
                return [per_char * len(c) for c in completions]

            def any_kwargs(prompts, completions, rows, **kwargs):
                return [float(len(kwargs))] * len(completions)

            def two_args(prompts, completions):
                return [0.0] * len(completions)

            NOT_A_FUNCTION = 3
            """
        )
    )
    (tmp_path / "broken_rewards.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    for name in ("my_rewards", "broken_rewards"):
        sys.modules.pop(name, None)


def test_builtins_are_registered():
    assert set(BUILTINS) <= set(reward_names())
    assert reward_names() == sorted(reward_names())


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(
        ConfigError, match="unknown reward function 'exact'; known reward functions: exact_match, "
    ):
        get_reward("exact")
    with pytest.raises(ConfigError, match="dotted path"):
        get_reward("nope")


def test_dotted_path_loads_user_code_with_kwargs(user_module):
    fn = make_reward("my_rewards.length_bonus", per_char=0.5)
    assert fn.__name__ == "length_bonus"
    assert fn(["a", "b"], ["xy", "xyzw"], [{}, {}]) == [1.0, 2.0]
    assert make_reward("my_rewards.length_bonus")(["a"], ["xyz"], [{}]) == [pytest.approx(0.3)]
    assert make_reward("my_rewards.any_kwargs", a=1, b=2)(["a"], ["x"], [{}]) == [2.0]
    with pytest.raises(ConfigError, match=r"unknown argument\(s\) scale.*allowed: per_char"):
        make_reward("my_rewards.length_bonus", scale=2)


@pytest.mark.parametrize(
    ("path", "pattern"),
    [
        ("no_such_pkg.rewards.fn", r"cannot import module 'no_such_pkg\.rewards' \(ModuleNotFound"),
        ("broken_rewards.fn", r"cannot import module 'broken_rewards' \(RuntimeError: boom"),
        ("my_rewards.missing", r"module 'my_rewards' has no 'missing'"),
        ("my_rewards.NOT_A_FUNCTION", r"is a int, not a function"),
        ("my_rewards.two_args", r"must take \(prompts, completions, rows\)"),
    ],
)
def test_bad_dotted_paths_are_one_clear_line(user_module, path, pattern):
    with pytest.raises(ArdeaError, match=pattern) as info:
        make_reward(path)
    assert "\n" not in str(info.value)


def test_register_reward_decorator_and_duplicates():
    name = "test_registry_constant_reward"
    try:

        @register_reward(name)
        def constant(prompts, completions, rows, *, value=1.0):
            return [value] * len(completions)

        assert get_reward(name) is constant
        assert make_reward(name, value=0.25)(["p"], ["c"], [{}]) == [0.25]
        with pytest.raises(ValueError, match="already registered"):
            register_reward(name)(constant)
    finally:
        registry_module.REWARDS.unregister(name)
