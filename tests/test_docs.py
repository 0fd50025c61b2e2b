"""The documentation: the README stays a short guide whose links resolve, the site builds
strictly (a broken link, a missing reference or any warning fails it), the pages generated
from the code (scripts/gen_docs.py) are current, and the configuration reference holds every
section with its help and every key with its help text, type, default and choices."""

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ardea.config import config_keys, load_config
from ardea.config.reference import config_reference_markdown, config_sections, yaml_value
from ardea.errors import ConfigError

REPO = Path(__file__).parents[1]


def _gen_docs():
    """scripts/gen_docs.py, the generator of the pages written from the code."""
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN_DOCS = _gen_docs()
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


def test_the_generated_pages_are_current():
    """docs/reference/config.md and cli.md, and the generated regions of hand-written pages
    (lists of registered names), are what scripts/gen_docs.py writes from the code now."""
    stale = GEN_DOCS.stale()
    assert not stale, f"not current: {stale}; run `{GEN_DOCS.COMMAND}` and commit the result"


def test_every_config_key_is_in_the_reference_with_its_help():
    page = config_reference_markdown()
    for item in config_keys():
        assert item.help.strip(), f"config key {item.key} has no help text"
        row = next(
            (line for line in page.splitlines() if line.startswith(f"| `{item.key}` |")), None
        )
        assert row is not None, f"{item.key} is missing from the configuration reference"
        required = item.default is dataclasses.MISSING
        default = "| required |" if required else f"`{yaml_value(item.default)}`"
        assert default in row.replace("\\|", "|"), (item.key, row)
        for choice in item.choices or ():
            assert f"`{yaml_value(choice)}`" in row, (item.key, choice)


def test_every_config_section_is_in_the_reference_with_its_help():
    """A section's own help (and a list section's default entries) heads its table."""
    page = config_reference_markdown()
    sections = list(config_sections())
    assert {s.key for s in sections} >= {"model", "algo.ppo", "rollout.vllm", "reward.functions"}
    for section in sections[1:]:  # the top level has no help of its own
        assert section.help.strip(), f"config section {section.key} has no help text"
        text = page.split(f"\n## {section.key}\n", 1)[1].split("\n## ", 1)[0]
        assert " ".join(section.help.split()).replace("<", "&lt;") in text, section.key
        if section.is_list:
            assert f"Default: `{yaml_value(section.default)}`" in text, section.key


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


def _names_in(text: str) -> list[str]:
    return re.findall(r"`([a-z_0-9]+)`", text)


def test_every_strategy_is_in_the_overview_and_the_algorithms_table():
    """The hand-written descriptions of the strategies (the overview's list, algorithms.md's
    table): one per registered strategy, no more, no less."""
    strategies = sorted(GEN_DOCS.registries()["algo.name"][0].names())
    index = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    overview = re.search(r"^- \*\*Strategies\*\*:(.*?)^- ", index, re.S | re.M).group(1)
    assert sorted(_names_in(overview)) == strategies
    algorithms = (REPO / "docs" / "howto" / "algorithms.md").read_text(encoding="utf-8")
    table = re.search(r"^\| `algo.name` \|.*?\n\n", algorithms, re.S | re.M).group(0)
    rows = re.findall(r"^\| `([a-z_]+)` \|", table, re.M)
    assert sorted(rows) == strategies


def test_every_reward_function_is_in_the_built_in_table():
    """rewards.md's hand-written table of the built-in functions: one row per registered
    reward function, no more, no less."""
    functions = sorted(GEN_DOCS.registries()["reward.functions[].name"][0].names())
    rewards = (REPO / "docs" / "howto" / "rewards.md").read_text(encoding="utf-8")
    table = rewards.split("## Built-in functions", 1)[1].split("\n\n", 2)[1]
    assert sorted(re.findall(r"^\| `([a-z_]+)` \|", table, re.M)) == functions


#: config keys whose help text lists the registered names it takes (``algo.name``'s says
#: "seq, sft, dpo, grpo, ..." and ``data.task``'s points at ``ardea tasks``: not lists)
HELP_LISTS = [
    "agent.env",
    "algo.policy_loss",
    "algo.ppo.adv_estimator",
    "reward.functions[].name",
    "rollout.engine",
]


@pytest.mark.parametrize("key", HELP_LISTS)
def test_a_help_text_that_lists_registered_names_lists_every_one(key):
    """The help of a key that takes a registered name (``ardea train --help-config``, the
    configuration reference) names each registered one: a new name cannot go unlisted."""
    help_text = next(item.help for item in config_keys() if item.key == key)
    registry = GEN_DOCS.registries()[key][0]
    words = set(re.findall(r"[a-z_0-9]+", help_text))
    assert set(registry.names()) <= words, (key, set(registry.names()) - words)


def test_every_ready_config_is_in_the_table():
    text = (REPO / "docs" / "howto" / "configure.md").read_text(encoding="utf-8")
    table = text.split("## Ready configs", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z_0-9]+\.yaml)` \|", table, re.M))
    assert listed == {p.name for p in (REPO / "configs").glob("*.yaml")}
