"""MkDocs hooks (mkdocs.yml `hooks:`): the API reference pages generated from the code at
build time, reference/api/<package>.md, the docstrings of each public module of a package
(the configuration and command-line references are committed pages, written by
scripts/gen_docs.py), and formulas (`$...$`, `$$...$$`, marked by pymdownx.arithmatex)
turned into MathML when the page is built, which browsers draw without JavaScript: the site
reads offline.
"""

from __future__ import annotations

import html
import pkgutil
import re
from pathlib import Path

from latex2mathml.converter import convert as latex_to_mathml
from mkdocs.structure.files import File

SRC = Path(__file__).resolve().parents[1] / "src"


def on_files(files, config):
    """Add the generated API pages to the site's files."""
    pages = {}
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
