"""Config loading: defaults, YAML, overrides, and one clear error per bad input."""

import pytest
from omegaconf import OmegaConf

from ardea.config import ArdeaConfig, config_to_yaml, describe_config, load_config
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


def test_every_field_has_help_text():
    for line in describe_config().splitlines():
        if line.startswith("  "):
            assert line.split("# ", 1)[1].strip(), line


def test_structured_config_is_omegaconf_compatible():
    assert OmegaConf.structured(ArdeaConfig).trainer.max_steps == ArdeaConfig().trainer.max_steps


def test_errors_inside_list_entries_name_the_entry_type():
    with pytest.raises(
        ConfigError, match=r"unknown config key 'wieght'.*RewardFunctionConfig: name, weight"
    ):
        load_config(None, ["reward.functions=[{name: x, wieght: 2}]"])
    with pytest.raises(ConfigError, match=r"set a list field as a whole"):
        load_config(None, ["reward.functions.0.weight=3"])
