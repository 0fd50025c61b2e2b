"""ardea.registry: one lookup for every registry (by name, by dotted path, clear errors)."""

import textwrap

import pytest

from ardea.agent import env_class
from ardea.algo import get_advantage_estimator, get_policy_loss
from ardea.data import Task
from ardea.data.tasks import task_class
from ardea.errors import ConfigError
from ardea.registry import Registry, callable_check, subclass_check
from ardea.rollout import engine_factory
from ardea.trainer.strategies.base import strategy_class

Base = Exception  # a base the user modules below subclass too


@pytest.fixture
def shapes():
    registry: Registry[type] = Registry(
        "shape", "shapes", field="demo.shape", check=subclass_check(Base, "Exception")
    )

    @registry.register("square")
    class Square(Base):
        pass

    @registry.register("circle")
    class Circle(Base):
        pass

    return registry, Square


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    (tmp_path / "my_shapes.py").write_text(
        textwrap.dedent(
            """
            class Hexagon(Exception):
                pass

            NOT_A_CLASS = 3
            """
        )
    )
    (tmp_path / "broken_shapes.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_names_lookup_and_duplicates(shapes):
    registry, square = shapes
    assert registry.names() == ["circle", "square"] == list(registry)
    assert "square" in registry and "hexagon" not in registry
    assert registry.get("square") is square
    with pytest.raises(ValueError, match="shape 'square' is already registered"):
        registry.register("square")(square)
    registry.unregister("square")
    assert registry.names() == ["circle"]


def test_unknown_name_lists_the_known_ones(shapes):
    registry, _ = shapes
    with pytest.raises(
        ConfigError,
        match=r"^unknown shape demo\.shape='sqare'; known shapes: circle, square \(or a dotted",
    ):
        registry.get("sqare")
    with pytest.raises(ConfigError, match="a shape is named by a string, got 3"):
        registry.get(3)


def test_dotted_paths_import_and_are_checked(shapes, user_package):
    registry, _ = shapes
    assert registry.get("my_shapes.Hexagon").__name__ == "Hexagon"
    cases = [
        ("my_shapes.NOT_A_CLASS", r"'my_shapes\.NOT_A_CLASS' is 3, not a subclass of Exception"),
        ("my_shapes.Octagon", r"^shape demo\.shape='my_shapes\.Octagon': module 'my_shapes' has"),
        ("broken_shapes.X", r"cannot import module 'broken_shapes' \(RuntimeError: boom\)"),
        ("no_such_pkg.X", r"cannot import module 'no_such_pkg' \(ModuleNotFoundError"),
    ]
    for path, pattern in cases:
        with pytest.raises(ConfigError, match=pattern):
            registry.get(path)


def test_the_check_runs_on_registration():
    registry: Registry = Registry("hook", "hooks", check=callable_check)
    with pytest.raises(ConfigError, match="'bad' is a str, not a function"):
        registry.register("bad")("text")
    assert registry.names() == []


def test_every_registry_takes_a_dotted_path_to_a_registered_entry():
    """Each of ardea's registries resolves the dotted path of one of its own entries to the
    same object as its registered name."""
    pairs = [
        (strategy_class, "sft", "ardea.trainer.strategies.sft.SFTStrategy"),
        (task_class, "arithmetic", "ardea.data.tasks.arithmetic.ArithmeticTask"),
        (env_class, "guess_number", "ardea.agent.builtin_envs.GuessNumber"),
        (get_advantage_estimator, "rloo", "ardea.algo.advantages.rloo_advantages"),
        (get_policy_loss, "gspo", "ardea.algo.policy_loss.gspo"),
        (engine_factory, "in_process", "ardea.rollout.engines.inprocess.engine.in_process_engine"),
    ]
    for lookup, name, path in pairs:
        assert lookup(path) is lookup(name), path


def test_dotted_paths_of_the_wrong_kind_are_refused():
    with pytest.raises(ConfigError, match="not a subclass of ardea.data.Task"):
        task_class("ardea.agent.builtin_envs.GuessNumber")
    with pytest.raises(ConfigError, match="not a subclass of ardea.trainer.Strategy"):
        strategy_class("ardea.data.Task")
    with pytest.raises(ConfigError, match=r"unknown task data\.task='nope'; known tasks: "):
        task_class("nope")
    assert issubclass(task_class("arithmetic"), Task)
