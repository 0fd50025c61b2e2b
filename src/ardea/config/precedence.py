"""How command-line overrides reach the stages of a staged run: the command line wins.

Precedence, lowest first: the dataclass defaults, the config file's top level, the config
file's ``stages.NAME`` values, the command line. A command-line ``section.key=value``
applies to the top level and to every stage, after the stage's own values;
``stages.NAME.section.key=value`` applies to that one stage, after everything else.

Two keys are not copied into every stage:

- ``model.path`` is where the run starts: it goes to the first stage only; later stages
  still start from the previous stage's final policy unless ``stages.NAME.model.path``
  is given.
- ``trainer.output_dir``, ``trainer.run_name`` and ``trainer.resume`` belong to the whole
  run (each stage runs in ``<run dir>/<name>/`` and resumes as the run does); they stay at
  the top level.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from ardea.errors import ConfigError

#: keys that belong to the whole run, never to one stage
RUN_KEYS = (("trainer", "output_dir"), ("trainer", "run_name"), ("trainer", "resume"))
#: the key only the first stage takes from the command line
START_KEY = ("model", "path")


def _without(layer: DictConfig, keys: tuple[tuple[str, str], ...]) -> DictConfig:
    """A copy of ``layer`` without the ``section.key`` entries in ``keys``."""
    out = layer.copy()
    for section, key in keys:
        if section in out and isinstance(out[section], DictConfig) and key in out[section]:
            del out[section][key]
            if not out[section]:
                del out[section]
    return out


def run_level_keys(mapping: DictConfig) -> list[str]:
    """The dotted run-level keys (``trainer.output_dir`` ...) that ``mapping`` sets."""
    return [
        f"{section}.{key}"
        for section, key in RUN_KEYS
        if isinstance(mapping.get(section), DictConfig) and key in mapping[section]
    ]


def apply_to_stages(file_stages: DictConfig, command_line: DictConfig) -> DictConfig:
    """Each stage's mapping with the command line folded in after the stage's own values.

    Args:
        file_stages: ``stages`` as the config file gives it (empty without a file or stages).
        command_line: the parsed ``key=value`` overrides, ``stages`` included.

    Returns:
        ``stages`` as it runs: for every stage, file values < command-line ``section.key``
        values < command-line ``stages.NAME`` values.

    Raises:
        ConfigError: the command line addresses a stage that the config file does not
            define (a run-level key set for one stage is refused by ``stage_configs``).
    """
    cli_stages = command_line.get("stages") or OmegaConf.create({})
    general = _without(OmegaConf.masked_copy(command_line, _sections(command_line)), RUN_KEYS)
    if file_stages:
        unknown = [name for name in cli_stages if name not in file_stages]
        if unknown:
            raise ConfigError(
                f"unknown stage stages.{unknown[0]} (command line); the config's stages: "
                f"{', '.join(map(str, file_stages))}"
            )
    names = list(file_stages) + [name for name in cli_stages if name not in file_stages]
    out = {}
    for index, name in enumerate(names):
        own = file_stages.get(name)
        if own is not None and not isinstance(own, DictConfig):
            out[name] = own  # not a mapping: ArdeaConfig's check names it
            continue
        layers = [
            own or {},
            general if index == 0 else _without(general, (START_KEY,)),
            cli_stages.get(name) or {},
        ]
        out[name] = OmegaConf.merge(*layers)
    return OmegaConf.create(out)


def _sections(command_line: DictConfig) -> list[str]:
    """The command line's top-level keys but ``stages``."""
    return [str(key) for key in command_line if key != "stages"]
