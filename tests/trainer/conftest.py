"""Fixtures of the trainer tests: importable reward modules written for one test."""

import sys

import pytest
from online_testing import REWARD_MODULE


@pytest.fixture
def write_reward_module(tmp_path, monkeypatch):
    """``write(name, source)``: an importable module of reward functions for the test, gone
    from ``sys.modules`` afterwards (a fresh import, with fresh state, in every test)."""
    names = []

    def write(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        sys.modules.pop(name, None)
        names.append(name)

    yield write
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture
def reward_module(write_reward_module):
    """``ardea_test_rewards.digit_fraction``, the reward of :data:`online_testing.RUN`."""
    write_reward_module("ardea_test_rewards", REWARD_MODULE)
