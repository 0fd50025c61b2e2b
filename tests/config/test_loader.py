"""Config loading: defaults, YAML, overrides, and one clear error per bad input."""

import pytest
from omegaconf import OmegaConf

from ardea.config import (
    ArdeaConfig,
    config_keys,
    config_to_yaml,
    describe_config,
    load_config,
    stage_configs,
)
from ardea.errors import ConfigError


def test_defaults_are_the_dataclass_defaults():
    config = load_config()
    assert isinstance(config, ArdeaConfig)
    assert config.trainer.run_name == "default"
    assert config.model.path is None
    assert config.data.task == "arithmetic"


def test_yaml_then_overrides_take_precedence(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  max_steps: 7\n  lr: 0.5\ndata:\n  task_args: {digits: 2}\n")
    config = load_config(path, ["trainer.lr=0.25", "data.task_args.ops=+-"])
    assert config.trainer.max_steps == 7
    assert config.trainer.lr == 0.25
    assert config.data.task_args == {"digits": 2, "ops": "+-"}


def test_resolved_yaml_round_trips(tmp_path):
    config = load_config(None, ["trainer.max_steps=3", "model.hidden_size=64"])
    path = tmp_path / "saved.yaml"
    path.write_text(config_to_yaml(config))
    assert load_config(path) == config


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (
            ["trainer.foo=1"],
            r"unknown config key 'trainer\.foo'.*allowed keys in 'trainer':.*max_steps",
        ),
        (["bogus=1"], r"unknown config key 'bogus'.*top level: model, data, algo"),
        (["trainer.max_steps=abc"], r"trainer\.max_steps: .*'abc'.*Integer"),
        (["trainer.max_steps=0"], r"trainer\.max_steps=0 is out of range"),
        (["trainer.lr_schedule=step"], r"trainer\.lr_schedule='step' is not allowed.*'cosine'"),
        (["model.dtype=int8"], r"model\.dtype='int8'.*float32"),
        (
            ["trainer.batch_size=10", "trainer.grad_accum_steps=3"],
            r"divisible by trainer\.grad_accum_steps=3",
        ),
        (["rollout.top_p=0"], r"rollout\.top_p=0"),
        (
            ["rollout.max_new_tokens=8", "rollout.min_new_tokens=9"],
            r"^rollout\.min_new_tokens=9 exceeds rollout\.max_new_tokens=8",
        ),
        (["rollout.min_new_tokens=-1"], r"^rollout\.min_new_tokens=-1 is out of range"),
        (["trainer.device=tpu"], r"trainer\.device='tpu'"),
        (["rollout.partial=true"], r"^rollout\.partial=true needs rollout\.max_staleness >= 1"),
        (
            ["rollout.partial=true", "rollout.max_staleness=1", "rollout.in_flight=keep"],
            r"^rollout\.in_flight='keep' is not allowed.*'resume', 'restart'",
        ),
        (["rollout.in_flight=restart"], r"in_flight='restart' takes effect only with .*partial"),
        (["max_steps"], r"not of the form key=value"),
    ],
)
def test_bad_overrides_name_the_field(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(None, overrides)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(listed)


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  hiden_size: 3\n")
    with pytest.raises(ConfigError, match=rf"'model\.hiden_size' \({path}\)"):
        load_config(path)


def test_help_config_lists_every_key_with_its_help():
    described = describe_config()
    keys = list(config_keys())
    assert len(keys) > 100  # nested sections (algo.ppo, rollout.vllm, reward.functions[]) too
    for item in keys:
        assert item.help.strip(), f"config key {item.key} has no help text"
        leaf = item.key.rsplit(".", 1)[-1]
        assert f"{leaf} = " in described and item.help in described, item.key


def test_structured_config_is_omegaconf_compatible():
    assert OmegaConf.structured(ArdeaConfig).trainer.max_steps == ArdeaConfig().trainer.max_steps


def test_errors_inside_list_entries_name_the_entry_type():
    with pytest.raises(
        ConfigError, match=r"unknown config key 'wieght'.*RewardFunctionConfig: name, weight"
    ):
        load_config(None, ["reward.functions=[{name: x, wieght: 2}]"])
    with pytest.raises(ConfigError, match=r"set a list field as a whole"):
        load_config(None, ["reward.functions.0.weight=3"])


STAGED = """\
trainer: {max_steps: 50, lr: 0.5}
stages:
  sft: {trainer: {max_steps: 7, batch_size: 8}}
  rl: {algo: {name: online_grpo}, trainer: {max_steps: 9}}
"""


def staged(tmp_path, overrides, text=STAGED):
    path = tmp_path / "staged.yaml"
    path.write_text(text)
    config = load_config(path, overrides)
    return config, dict(stage_configs(config))


def test_command_line_values_reach_every_stage_after_its_own(tmp_path):
    config, stages = staged(tmp_path, ["trainer.max_steps=3", "trainer.batch_size=16"])
    assert config.trainer.max_steps == 3
    assert [s.trainer.max_steps for s in stages.values()] == [3, 3]
    assert [s.trainer.batch_size for s in stages.values()] == [16, 16]
    assert [s.trainer.lr for s in stages.values()] == [0.5, 0.5]  # untouched: the file's
    assert stages["rl"].algo.name == "online_grpo"
    _, unchanged = staged(tmp_path, [])
    assert [s.trainer.max_steps for s in unchanged.values()] == [7, 9]


def test_a_stage_override_changes_that_stage_only_whatever_the_order(tmp_path):
    _, stages = staged(tmp_path, ["stages.rl.trainer.max_steps=4", "trainer.max_steps=3"])
    assert stages["sft"].trainer.max_steps == 3 and stages["rl"].trainer.max_steps == 4
    _, stages = staged(tmp_path, ["stages.rl.trainer.max_steps=4"])
    assert stages["sft"].trainer.max_steps == 7 and stages["rl"].trainer.max_steps == 4


def test_command_line_model_path_is_where_the_first_stage_starts(tmp_path):
    config, stages = staged(tmp_path, ["model.path=/models/start"])
    assert stages["sft"].model.path == "/models/start"
    assert "model" in config.stages["sft"] and "model" not in config.stages["rl"]
    text = STAGED.replace("rl: {", "rl: {model: {path: /models/own}, ")
    _, stages = staged(tmp_path, ["model.path=/models/start"], text)
    assert stages["rl"].model.path == "/models/own"  # a stage's own model.path is kept


def test_run_level_keys_stay_at_the_top(tmp_path):
    config, stages = staged(tmp_path, ["trainer.output_dir=/tmp/x", "trainer.resume=auto"])
    assert config.trainer.output_dir == "/tmp/x" and config.trainer.resume == "auto"
    assert all("output_dir" not in dict(s.get("trainer", {})) for s in config.stages.values())
    with pytest.raises(ConfigError, match=r"stages\.rl\.trainer\.output_dir .* whole run"):
        staged(tmp_path, ["stages.rl.trainer.output_dir=/tmp/x"])


def test_an_unknown_stage_on_the_command_line_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown stage stages\.rll .*stages: sft, rl"):
        staged(tmp_path, ["stages.rll.trainer.max_steps=3"])


def test_stages_given_on_the_command_line_take_the_other_overrides_too():
    stages_arg = "stages={a: {trainer: {max_steps: 4}}, b: {trainer: {max_steps: 5, lr: 0.1}}}"
    overrides = [
        stages_arg,
        "trainer.max_steps=2",
        "trainer.batch_size=16",
        "stages.b.trainer.lr=0.2",
    ]
    resolved = dict(stage_configs(load_config(None, overrides)))
    # stage values given on the command line are stages.NAME values: they win for their stage
    assert [s.trainer.max_steps for s in resolved.values()] == [4, 5]
    assert [s.trainer.batch_size for s in resolved.values()] == [16, 16]
    assert resolved["b"].trainer.lr == 0.2


def test_a_saved_staged_config_reloads_to_the_same_stages(tmp_path):
    config, stages = staged(tmp_path, ["trainer.max_steps=3", "stages.rl.trainer.lr=0.1"])
    saved = tmp_path / "saved.yaml"
    saved.write_text(config_to_yaml(config))
    assert dict(stage_configs(load_config(saved))) == stages


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["agent.export=call", "agent.reward_discount=1.5"], r"agent.reward_discount=1.5"),
        (["agent.export=call", "agent.reward_discount=-0.1"], r"agent.reward_discount=-0.1"),
        (["agent.reward_discount=0.5"], r"reward_discount=0.5 .* only agent.export=call"),
    ],
)
def test_a_reward_discount_outside_0_1_or_without_call_export_is_an_error(overrides, message):
    """A discount above 1 would grow rewards backwards through an episode; with
    export=conversation the episode is one row and a discount between its calls would
    silently change nothing."""
    agent = ["agent.env=guess_number", "data.task=null", "algo.name=online_ppo"]
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*agent, *overrides])
    config = load_config(None, [*agent, "agent.export=call", "agent.reward_discount=0.5"])
    assert config.agent.reward_discount == 0.5


def test_another_task_does_not_inherit_the_old_tasks_arguments(tmp_path):
    """task_args belong to their task: naming another task drops the lower level's, whether
    the command line or a stage names it; the same task merges them key by key."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "data: {task: arithmetic, task_args: {digits: 3, reverse: true}}\n"
        "stages:\n  a: {}\n  b: {data: {task: countdown, task_args: {numbers: 3}}}\n"
    )
    other = load_config(path, ["data.task=reasoning_gym", "data.task_args={dataset: gcd}"])
    assert other.data.task_args == {"dataset": "gcd"}
    assert load_config(path, ["data.task=countdown"]).data.task_args == {}
    same = load_config(path, ["data.task=arithmetic", "data.task_args.digits=2"])
    assert same.data.task_args == {"digits": 2, "reverse": True}
    stages = dict(stage_configs(load_config(path)))
    assert stages["a"].data.task_args == {"digits": 3, "reverse": True}
    assert stages["b"].data.task_args == {"numbers": 3}
