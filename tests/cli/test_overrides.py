"""What is typed on the command line wins, in every stage, or fails naming it: through the
real ``ardea train``, with and without a config file."""

import json
from pathlib import Path

import pytest
import yaml
from cli_testing import ardea, run_cli

from ardea.cli.catalog import READY_CONFIGS
from ardea.cli.main import EXIT_USER_ERROR, main
from ardea.config import DEFAULT_RECIPE
from ardea.data import task_names
from ardea.reward import reward_names
from ardea.trainer import strategy_names

REPO = Path(__file__).parents[2]
SFT_CONFIG = str(REPO / "configs" / "sft_arithmetic.yaml")
QUICK = ["data.eval_size=16", "trainer.num_threads=1", "logging.progress=false"]


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    """The default recipe with ``trainer.max_steps=2`` on the command line."""
    root = tmp_path_factory.mktemp("recipe")
    ardea("train", "trainer.max_steps=2", *QUICK, f"trainer.output_dir={root / 'run'}", cwd=root)
    return root / "run"


@pytest.mark.slow
def test_max_steps_on_the_command_line_shortens_every_stage(recipe_run):
    results = json.loads((recipe_run / "results.json").read_text())
    assert results["stages"] == ["sft", "rl"]
    assert results["sft"]["steps"] == 2 and results["rl"]["steps"] == 2
    for stage in ("sft", "rl"):
        assert json.loads((recipe_run / stage / "results.json").read_text())["steps"] == 2
        saved = yaml.safe_load((recipe_run / stage / "config.yaml").read_text())
        assert saved["trainer"]["max_steps"] == 2
    # everything else the recipe's stages set is kept: batch sizes 64 and 32
    rl = yaml.safe_load((recipe_run / "rl" / "config.yaml").read_text())
    assert rl["trainer"]["batch_size"] == 32 and rl["algo"]["name"] == "online_grpo"


def print_config(capsys, *args: str) -> str:
    """``ardea train --print-config ARGS``' output (in-process: no interpreter start)."""
    assert main(["train", "--print-config", *args]) == 0
    return capsys.readouterr().out


def printed_stages(capsys, *args: str) -> dict[str, dict]:
    """Each stage's printed config by stage name."""
    documents = [yaml.safe_load(text) for text in print_config(capsys, *args).split("---\n")]
    return {Path(d["trainer"]["output_dir"]).name: d for d in documents}


def test_a_stage_override_changes_that_stage_only(capsys):
    stages = printed_stages(capsys, "stages.rl.trainer.max_steps=3")
    recipe = yaml.safe_load(DEFAULT_RECIPE.read_text())["stages"]
    assert stages["sft"]["trainer"]["max_steps"] == recipe["sft"]["trainer"]["max_steps"]
    assert stages["rl"]["trainer"]["max_steps"] == 3
    both = printed_stages(capsys, "trainer.max_steps=2", "stages.rl.trainer.max_steps=3")
    assert [both[s]["trainer"]["max_steps"] for s in ("sft", "rl")] == [2, 3]


@pytest.mark.slow
def test_print_config_shows_each_stage_as_it_runs(recipe_run, capsys):
    start = str(recipe_run / "sft" / "checkpoints" / "step_0000002" / "policy")
    args = [f"model.path={start}", "rollout.max_new_tokens=6"]
    assert "starting from the final policy of stage sft" in print_config(capsys, *args)
    stages = printed_stages(capsys, *args)
    assert list(stages) == ["sft", "rl"]
    assert stages["sft"]["model"]["path"] == start  # where the run starts
    assert stages["rl"]["model"]["path"] == "<the final policy of stage sft>"
    assert all(s["rollout"]["max_new_tokens"] == 6 for s in stages.values())
    assert stages["rl"]["algo"]["dynamic_sampling"] is True  # the recipe's own RL values
    assert stages["sft"]["trainer"]["output_dir"] == str(Path("runs/default/sft"))


BAD = [
    ("algo.name=nosuch", "unknown strategy algo.name='nosuch'", strategy_names()),
    (
        "reward.functions=[{name: nosuch}]",
        "reward.functions[0]: unknown reward function 'nosuch'",
        reward_names(),
    ),
    ("data.task=nosuch", "unknown task data.task='nosuch'", task_names()),
]


@pytest.mark.parametrize(
    "config", [[], [SFT_CONFIG], ["--recipe", "none"]], ids=["recipe", "file", "none"]
)
@pytest.mark.parametrize(("override", "needle", "known"), BAD, ids=["algo", "reward", "task"])
def test_a_name_that_exists_nowhere_fails_before_any_stage(
    config, override, needle, known, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # in-process, as `ardea train` (no interpreter start each)
    assert main(["train", *config, override]) == EXIT_USER_ERROR
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert ", ".join(known) in lines[0]
    assert "[ardea] stage" not in out and not (tmp_path / "runs").exists()


def test_the_real_command_fails_in_one_line_before_any_stage(tmp_path):
    result = run_cli("train", "algo.name=nosuch", cwd=tmp_path)
    assert result.returncode == EXIT_USER_ERROR and result.stdout == ""
    assert result.stderr.startswith("ardea train: error: unknown strategy algo.name='nosuch'")
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_recipe_none_runs_the_top_level_config_alone(recipe_run, tmp_path):
    start = recipe_run / "sft" / "checkpoints" / "step_0000002" / "policy"
    args = [
        "--recipe",
        "none",
        "algo.name=online_grpo",
        f"model.path={start}",
        "trainer.max_steps=2",
        "trainer.batch_size=4",
        "rollout.group_size=2",
        "rollout.max_new_tokens=6",
        *QUICK,
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    ardea("train", *args, cwd=tmp_path)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["strategy"] == "online_grpo" and results["steps"] == 2
    assert "stages" not in results and not (tmp_path / "run" / "sft").exists()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"]["path"] == str(start) and saved["stages"] == {}


def test_recipe_and_a_config_file_together_are_an_error(tmp_path):
    result = run_cli("train", SFT_CONFIG, "--recipe", "none", cwd=tmp_path)
    assert result.returncode == 2 and "give one of them" in result.stderr


def test_help_names_the_recipe_its_yaml_and_the_ready_configs(tmp_path):
    out = " ".join(ardea("train", "--help", cwd=tmp_path).stdout.split())
    assert str(DEFAULT_RECIPE) in out and "--recipe" in out and "precedence" in out
    assert "stages sft (sft), rl (online_grpo)" in out
    assert all(name in out for name in READY_CONFIGS)
    assert sorted(READY_CONFIGS) == sorted(p.name for p in (REPO / "configs").glob("*.yaml"))


def test_tasks_lists_description_arguments_and_an_example(tmp_path):
    from ardea.data import make_task

    out = ardea("tasks", cwd=tmp_path).stdout
    assert "arithmetic: Integer arithmetic" in out
    assert "task_args: digits=3, ops='+', test_fraction=0.1" in out
    assert "count=4, max_number=50, max_target=100, min_ops=1" in out
    assert "task_args: path (required), test_fraction=None" in out
    for name, args in [
        ("arithmetic", {}),
        ("countdown", {}),
        ("math_jsonl", {"path": str(REPO / "examples/data/gsm8k_mini.jsonl")}),
    ]:
        example = make_task(name, **args).examples("train", 1)[0]
        assert f"prompt {example.prompt!r}" in out and f"answer {example.answer!r}" in out
    assert out.count("  task_args: ") == len(task_names())


def test_overrides_may_follow_the_options():
    from ardea.cli.main import parse_args

    assert parse_args(["eval", "run", "--k", "4", "data.eval_size=8"]).args == ["data.eval_size=8"]
    train = parse_args(["train", "a.yaml", "--print-config", "trainer.max_steps=3"])
    assert train.args == ["a.yaml", "trainer.max_steps=3"] and train.print_config
    with pytest.raises(SystemExit):  # generate takes no overrides
        parse_args(["generate", "model", "--prompt", "1+1=", "x=1"])
    with pytest.raises(SystemExit):
        parse_args(["eval", "run", "--nosuch", "data.eval_size=8"])
