"""Where a run writes: never over another run. The runs here are their config.yaml files,
written as a run writes them (nothing is trained: the claim reads only those)."""

from pathlib import Path

import pytest

from ardea.cli.main import main
from ardea.config import DEFAULT_RECIPE, load_config
from ardea.errors import ArdeaError
from ardea.trainer.run_dirs import claim_run_directory, config_differences, prepare_run_directory


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def recipe(*overrides):
    return load_config(DEFAULT_RECIPE, list(overrides))


def test_a_new_directory_is_used_as_asked():
    config, note = claim_run_directory(recipe())
    assert config.trainer.output_dir is None and note is None


def test_a_changed_recipe_goes_beside_the_run_it_would_overwrite():
    prepare_run_directory(recipe())  # the default recipe's run in runs/default
    config, note = claim_run_directory(recipe("stages.rl.trainer.max_steps=50"))
    assert config.trainer.output_dir == "runs/default-2"
    assert note == (
        "runs/default holds another run (stages.rl.trainer.max_steps is 200 there, 50 here); "
        "this run writes to runs/default-2 (trainer.resume=auto continues the one in runs/default)"
    )
    prepare_run_directory(config)
    again, note = claim_run_directory(recipe())  # the same config again: a third directory
    assert again.trainer.output_dir == "runs/default-3"
    assert note.startswith("runs/default holds a run of this config; this run writes to")


def test_the_first_difference_in_the_configs_order():
    held = {"model": {"hidden_size": 64}, "trainer": {"lr": 0.003, "max_steps": 10}}
    wanted = {"model": {"hidden_size": 64}, "trainer": {"lr": 0.001, "max_steps": 20}}
    assert config_differences(held, wanted) == [
        ("trainer.lr", 0.003, 0.001),
        ("trainer.max_steps", 10, 20),
    ]
    # where a run goes is not what it is; a section key of another version is not compared
    held["trainer"] |= {"run_name": "a", "output_dir": "x", "resume": "never", "old_key": 1}
    wanted["trainer"] |= {"run_name": "b", "output_dir": None, "resume": "auto", "new_key": 2}
    assert [d[0] for d in config_differences(held, wanted)] == ["trainer.lr", "trainer.max_steps"]
    # a stage's override set on one side only is a difference
    stages = config_differences({"stages": {"rl": {}}}, {"stages": {"rl": {"trainer": {"lr": 1}}}})
    assert stages == [("stages.rl.trainer.lr", None, 1)]


def test_resume_auto_continues_only_a_run_of_the_same_config():
    prepare_run_directory(recipe())
    # step counts, cadences and logging may change when a run continues
    config, note = claim_run_directory(
        recipe("trainer.resume=auto", "stages.rl.trainer.max_steps=300", "logging.progress=false")
    )
    assert config.trainer.output_dir is None and note is None
    with pytest.raises(ArdeaError) as error:
        claim_run_directory(recipe("trainer.resume=auto", "stages.rl.trainer.lr=1e-4"))
    assert str(error.value) == (
        "trainer.resume=auto: runs/default holds a run of another config "
        "(stages.rl.trainer.lr is 0.0002 there, 0.0001 here); give stages.rl.trainer.lr=0.0002 "
        "to continue it, or leave trainer.resume=auto out to start a new run beside it"
    )


def test_a_named_output_dir_is_never_renamed(tmp_path):
    prepare_run_directory(recipe(f"trainer.output_dir={tmp_path / 'mine'}"))
    with pytest.raises(ArdeaError, match=r"mine holds another run \(model.num_heads is 8 there, 4"):
        claim_run_directory(
            load_config(None, [f"trainer.output_dir={tmp_path / 'mine'}", "data.task=arithmetic"])
        )


def test_checkpoints_without_a_config_are_a_run_too():
    (Path("runs") / "default" / "checkpoints").mkdir(parents=True)
    config, note = claim_run_directory(recipe())
    assert config.trainer.output_dir == "runs/default-2"
    assert note.startswith("runs/default holds a run without its config.yaml; this run")


def test_print_config_shows_where_the_run_would_write(capsys):
    prepare_run_directory(recipe())
    assert main(["train", "stages.rl.trainer.max_steps=50", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "# stage 1 of 2: sft, in runs/default-2/sft" in printed
    assert "output_dir: runs/default-2" in printed
