"""The documentation: the README stays a short guide whose links resolve, the site builds
strictly (a broken link, a missing reference or any warning fails it), and the generated
configuration reference holds every key with its help text, type, default and choices."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ardea.config import config_keys, load_config
from ardea.config.reference import config_reference_markdown, yaml_value
from ardea.errors import ConfigError

REPO = Path(__file__).parents[1]
README = REPO / "README.md"
#: a Markdown link's target: [text](target) or ![alt](target)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_a_short_guide():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the limit is 200"


def test_the_readme_links_to_files_that_exist():
    for target in LINK.findall(README.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        path = target.split("#", 1)[0]
        assert (REPO / path).exists(), f"README.md links to {target}, which does not exist"


def test_every_how_to_guide_is_one_click_from_the_readme():
    linked = {
        (REPO / t.split("#", 1)[0]).resolve()
        for t in LINK.findall(README.read_text(encoding="utf-8"))
    }
    guides = sorted((REPO / "docs" / "howto").glob("*.md"))
    assert guides, "docs/howto/ has no pages"
    missing = [g.name for g in guides if g.resolve() not in linked]
    assert not missing, f"how-to guides not linked from README.md: {missing}"


def test_every_config_key_is_in_the_reference_with_its_help():
    page = config_reference_markdown()
    for item in config_keys():
        assert item.help.strip(), f"config key {item.key} has no help text"
        row = next(
            (line for line in page.splitlines() if line.startswith(f"| `{item.key}` |")), None
        )
        assert row is not None, f"{item.key} is missing from the configuration reference"
        assert f"`{yaml_value(item.default)}`" in row.replace("\\|", "|"), (item.key, row)
        for choice in item.choices or ():
            assert f"`{yaml_value(choice)}`" in row, (item.key, choice)


CHOICE_KEYS = [k for k in config_keys() if k.choices and "[]" not in k.key]


@pytest.mark.parametrize("item", CHOICE_KEYS, ids=lambda k: k.key)
def test_a_key_with_choices_refuses_any_other_value(item):
    assert item.default in item.choices, (item.key, item.default, item.choices)
    with pytest.raises(ConfigError, match=rf"{re.escape(item.key)}='bogus' is not allowed"):
        load_config(None, [f"{item.key}=bogus"])


@pytest.mark.slow
def test_the_site_builds_strictly_with_every_key_in_its_reference(tmp_path):
    """`make docs`' build: offline, strict (warnings fail it), a few seconds."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # the theme's banner about MkDocs 2
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING" not in built.stdout + built.stderr, built.stderr
    config_page = (tmp_path / "site" / "reference" / "config.html").read_text(encoding="utf-8")
    for item in config_keys():
        assert f"<code>{item.key}</code>" in config_page, item.key
    api_page = (tmp_path / "site" / "reference" / "api" / "algo.html").read_text(encoding="utf-8")
    assert "compute_token_level_gae" in api_page  # docstrings rendered from the code
    assert (tmp_path / "site" / "reference" / "cli.html").is_file()


def _registries() -> dict:
    """The configure.md "Names" table's keys and the registries that hold their names."""
    import ardea.agent  # noqa: F401  (registering: environments)
    import ardea.trainer.strategies  # noqa: F401  (registering: strategies)
    from ardea.agent.env import ENVIRONMENTS
    from ardea.algo.advantages import ADVANTAGE_ESTIMATORS
    from ardea.algo.policy_loss_registry import POLICY_LOSSES
    from ardea.data.tasks.base import TASKS
    from ardea.reward.registry import REWARDS
    from ardea.rollout.engine import ENGINES
    from ardea.trainer.strategies.base import STRATEGIES

    return {
        "algo.name": STRATEGIES, "data.task": TASKS, "reward.functions[].name": REWARDS,
        "algo.ppo.adv_estimator": ADVANTAGE_ESTIMATORS, "algo.policy_loss": POLICY_LOSSES,
        "agent.env": ENVIRONMENTS, "rollout.engine": ENGINES,
    }  # fmt: skip


def _names_in(row: str) -> set[str]:
    return set(re.findall(r"`([a-z_0-9]+)`", row))


def test_the_names_table_lists_every_registered_name():
    """docs/howto/configure.md's table of names: each row is its registry, no more, no less."""
    text = (REPO / "docs" / "howto" / "configure.md").read_text(encoding="utf-8")
    for key, registry in _registries().items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{key}` |"))
        assert _names_in(row.split("|")[2]) == set(registry.names()), key


def test_every_strategy_is_in_the_overview_and_the_algorithms_table():
    strategies = set(_registries()["algo.name"].names())
    index = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    overview = re.search(r"^- \*\*Strategies\*\*:(.*?)^- ", index, re.S | re.M).group(1)
    assert strategies <= _names_in(overview)
    algorithms = (REPO / "docs" / "howto" / "algorithms.md").read_text(encoding="utf-8")
    rows = {m.group(1) for m in re.finditer(r"^\| `([a-z_]+)` \|", algorithms, re.M)}
    assert strategies <= rows


def test_every_ready_config_is_in_the_table():
    text = (REPO / "docs" / "howto" / "configure.md").read_text(encoding="utf-8")
    table = text.split("## Ready configs", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z_0-9]+\.yaml)` \|", table, re.M))
    assert listed == {p.name for p in (REPO / "configs").glob("*.yaml")}
