"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages generated from the code at build
time, so none of them is maintained by hand:

- reference/config.md: every config key, from the config dataclasses' help texts;
- reference/cli.md: every command's `--help`;
- reference/api/<package>.md: the docstrings of each public module of a package.

and formulas (`$...$`, `$$...$$`, marked by pymdownx.arithmatex) turned into MathML when the
page is built, which browsers draw without JavaScript: the site reads offline.
"""

from __future__ import annotations

import argparse
import html
import pkgutil
import re
from pathlib import Path

from latex2mathml.converter import convert as latex_to_mathml
from mkdocs.structure.files import File

SRC = Path(__file__).resolve().parents[1] / "src"


def on_files(files, config):
    """Add the generated pages to the site's files."""
    from ardea.config.reference import config_reference_markdown

    pages = {
        "reference/config.md": config_reference_markdown(),
        "reference/cli.md": cli_reference_markdown(),
    }
    # every package of ardea gets a page (mkdocs.yml's nav must list it: strict mode fails
    # on a page left out of the nav)
    for info in pkgutil.iter_modules([str(SRC / "ardea")]):
        if info.ispkg:
            pages[f"reference/api/{info.name}.md"] = api_page(info.name)
    for path, content in pages.items():
        files.append(File.generated(config, path, content=content))
    return files


#: arithmatex's generic output: \\(...\\) in a span (inline), \\[...\\] in a div (display)
FORMULA = re.compile(
    r'<(span|div) class="arithmatex">\\(?:\((?P<inline>.*?)\\\)|\[(?P<block>.*?)\\\])</\1>',
    re.S,
)


def on_page_content(content, page, config, files):
    """Every formula of the page as MathML."""

    def mathml(match: re.Match) -> str:
        inline = match.group("inline") is not None
        latex = html.unescape(match.group("inline") if inline else match.group("block"))
        return latex_to_mathml(latex.strip(), display="inline" if inline else "block")

    return FORMULA.sub(mathml, content)


def cli_reference_markdown() -> str:
    """Each `ardea COMMAND --help`, as argparse prints it."""
    from ardea.cli.main import build_parser

    parser = build_parser()
    out = [
        "# Command line",
        "",
        "Each command's `--help`, generated from the command-line parser when the site is "
        "built. Run inside the project's environment (`.venv/bin/ardea`, or after "
        "`source .venv/bin/activate`).",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
    ]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        out += ["", f"## ardea {name}", "", "```text", command.format_help().rstrip(), "```"]
    return "\n".join(out) + "\n"


def api_page(package: str) -> str:
    """The package's docstring, then one section per public module (mkdocstrings)."""
    root = SRC / "ardea" / package
    modules = sorted(
        info.name
        for info in pkgutil.iter_modules([str(root)])
        if not info.name.startswith("_") and not info.ispkg
    )
    subpackages = sorted(info.name for info in pkgutil.iter_modules([str(root)]) if info.ispkg)
    out = [f"# ardea.{package}", "", f"::: ardea.{package}", "    options:", "      members: false",
           "      show_root_heading: false", ""]  # fmt: skip
    for name in subpackages:
        for info in sorted(pkgutil.iter_modules([str(root / name)]), key=lambda i: i.name):
            if not info.name.startswith("_"):
                modules.append(f"{name}.{info.name}")
    for name in modules:
        out += [f"::: ardea.{package}.{name}", ""]
    return "\n".join(out)
