"""``ardea train``: which config runs (a file, the default recipe, or none), and
``--print-config``'s view of what will actually run."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ardea.config import DEFAULT_RECIPE, ArdeaConfig, config_to_yaml, describe_config, load_config
from ardea.errors import ArdeaError

#: ``--recipe`` values: what ``ardea train`` runs without a config file
RECIPES = {"default": DEFAULT_RECIPE, "none": None}


def train(args: argparse.Namespace) -> int:
    """Load the config (file, ``--recipe`` or the default recipe, then the overrides) and
    print it or run it."""
    if args.help_config:
        print(describe_config())
        return 0
    config_path, overrides = split_config_and_overrides(args.args)
    config = load_config(_config_file(config_path, args.recipe), overrides)
    if args.print_config:
        print(resolved_yaml(config), end="")
        return 0
    from ardea.cli.commands import quiet_transformers

    quiet_transformers()
    from ardea.trainer import run

    run(config)
    return 0


def split_config_and_overrides(items: Sequence[str]) -> tuple[str | None, list[str]]:
    """``[config.yaml] key=value ...`` → (config path or None, overrides)."""
    config_path = None
    overrides = []
    for item in items:
        if "=" in item:
            overrides.append(item)
        elif config_path is None:
            config_path = item
        else:
            raise ArdeaError(
                f"unexpected argument {item!r}: give at most one config file, then key=value overrides"
            )
    return config_path, overrides


def _config_file(config_path: str | None, recipe: str | None) -> str | Path | None:
    """The YAML to load: the given file, else the ``--recipe`` (default: the default recipe)."""
    if config_path is not None and recipe is not None:
        raise ArdeaError(
            f"--recipe {recipe} and the config file {config_path} both say what to run; "
            "give one of them"
        )
    return config_path if config_path is not None else RECIPES[recipe or "default"]


def resolved_yaml(config: ArdeaConfig) -> str:
    """What will run, checked as a run checks it: the config, or for a staged run each
    stage's fully resolved config as one YAML document per stage."""
    from ardea.trainer import check_config, plan_stages, starts_from_previous
    from ardea.trainer.run_dirs import claim_run_directory

    config, _ = claim_run_directory(config)  # where it would write: beside a run it holds
    if not config.stages:
        check_config(config)
        return config_to_yaml(config)
    documents = []
    previous = None
    for index, (name, stage) in enumerate(plan_stages(config)):
        header = (
            f"# stage {index + 1} of {len(config.stages)}: {name}, in {stage.trainer.output_dir}"
        )
        if starts_from_previous(config, name, index):
            stage.model.path = f"<the final policy of stage {previous}>"
            header += f", starting from the final policy of stage {previous}"
        documents.append(f"{header}\n{config_to_yaml(stage)}")
        previous = name
    return "---\n".join(documents)
