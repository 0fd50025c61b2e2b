"""``trajectories.html``: what each logged step trained, token by token, in one
self-contained page (no server, no script from elsewhere).

Every row of ``trajectories.jsonl`` (:mod:`ardea.trainer.trajectory_samples`) is drawn as
its tokens' text: trained tokens (loss mask 1) on a background colour of their turn (turn
0, 1, 2, ... each its own hue), everything else — the prompt, tool output, environment
replies, role headers — in grey. Hovering a trained token shows its turn, behaviour
log-prob, advantage and policy version (the ``title`` of its ``span``, also kept in
``data-*`` attributes). A mask bug shows at a glance: a tool's output in colour, or a reply
in grey. Long runs keep at most ``MAX_STEPS`` logged steps, evenly spaced, first and last
included.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

MAX_STEPS = 100
HUES = (210, 30, 130, 280, 0, 55, 175, 320)  # turn k's hue: HUES[k % 8]

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; }
.legend span { display: inline-block; padding: 1px 6px; margin-right: 6px; border-radius: 3px; }
section.step { margin: 18px 0; border-top: 1px solid #ddd; padding-top: 8px; }
section.step h2 { font-size: 15px; margin: 4px 0 8px; }
.row { margin: 8px 0 14px; }
.meta { font-size: 12px; color: #555; margin-bottom: 2px; }
.tokens { font: 13px/1.6 ui-monospace, Menlo, Consolas, monospace; white-space: pre-wrap;
          word-break: break-word; background: #fafafa; border: 1px solid #eee;
          padding: 8px; margin: 0; }
.ctx { color: #9a9a9a; }
.gen { color: #111; border-radius: 2px; }
.gen:hover { outline: 2px solid #000; }
"""


def turn_colour(turn: int) -> str:
    """The background of turn ``turn``'s trained tokens."""
    return f"hsl({HUES[max(turn, 0) % len(HUES)]}, 75%, 82%)"


def read_rows(path: Path) -> dict[int, list[dict[str, Any]]]:
    """The rows of ``trajectories.jsonl`` by step (a ValueError naming a bad line). A line
    torn by a killed run (not JSON; a resumed run appends after it) is skipped."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # torn by a kill mid-write
        try:
            steps.setdefault(int(row["step"]), []).append(row)
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path} line {number}: not a trajectory record ({err})") from err
    return steps


def kept_steps(steps: list[int], limit: int = MAX_STEPS) -> list[int]:
    """At most ``limit`` of ``steps`` (sorted), evenly spaced, first and last kept."""
    if len(steps) <= limit:
        return steps
    picks = {round(i * (len(steps) - 1) / (limit - 1)) for i in range(limit)}
    return [steps[i] for i in sorted(picks)]


def token_span(row: dict[str, Any], t: int) -> str:
    """One token as a ``span`` (module docstring)."""
    text = html.escape(row["tokens"][t])
    if not row["trained"][t]:
        return f'<span class="ctx">{text}</span>'
    turn = row["turn"][t]
    values = {"logprob": row["logprob"][t], "advantage": row["advantage"][t]}
    values["version"] = row["version"][t]
    shown = " · ".join(f"{k} {'—' if v is None else v}" for k, v in values.items())
    data = " ".join(f'data-{k}="{"" if v is None else v}"' for k, v in values.items())
    return (
        f'<span class="gen turn-{turn}" style="background: {turn_colour(turn)}" '
        f'data-turn="{turn}" {data} title="turn {turn} · {shown}">{text}</span>'
    )


def row_html(row: dict[str, Any]) -> str:
    turns = sorted({t for t, m in zip(row["turn"], row["trained"]) if m})
    trained = sum(row["trained"])
    meta = (
        f"group {row['group']} · reward {row['reward']:g} · {len(row['tokens'])} tokens, "
        f"{trained} trained in {len(turns)} turn{'s' if len(turns) != 1 else ''}"
    )
    spans = "".join(token_span(row, t) for t in range(len(row["tokens"])))
    return (
        f'<div class="row" data-group="{row["group"]}" data-reward="{row["reward"]}">'
        f'<div class="meta">{html.escape(meta)}</div><pre class="tokens">{spans}</pre></div>'
    )


def write_trajectories_html(run_dir: str | Path) -> Path | None:
    """Draw ``<run_dir>/trajectories.jsonl`` into ``<run_dir>/trajectories.html`` and
    return its path (None when the run logged no trajectories: not an online run)."""
    run_dir = Path(run_dir)
    source = run_dir / "trajectories.jsonl"
    if not source.is_file():
        return None
    steps = read_rows(source)
    shown = kept_steps(sorted(steps))
    legend = "".join(
        f'<span style="background: {turn_colour(k)}">turn {k}</span>' for k in range(4)
    )
    legend += '<span class="key ctx">context (not trained)</span>'
    sections = "".join(
        f'<section class="step" data-step="{s}"><h2>step {s}</h2>'
        + "".join(row_html(r) for r in steps[s])
        + "</section>"
        for s in shown
    )
    note = f"{len(shown)} of {len(steps)} logged steps" if len(shown) < len(steps) else ""
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(run_dir.name)}: trajectories</title><style>{STYLE}</style>"
        f"</head><body><h1>What was trained: {html.escape(str(run_dir))}</h1>"
        f'<p class="legend">{legend} {html.escape(note)}</p>'
        "<p>Hover a trained token for its turn, behaviour log-prob, advantage and policy "
        f"version.</p>{sections}</body></html>"
    )
    out = run_dir / "trajectories.html"
    out.write_text(page, encoding="utf-8")
    return out
