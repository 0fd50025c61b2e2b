"""``trajectories.jsonl`` and ``trajectories.html``: the rows an RL step trained, token by
token (the right tokens trained, each with its own log-prob, advantage and version), and
the page ``ardea report`` draws from them, rendered by a real headless Chromium (its DOM
and a screenshot) for a single-turn and a multi-turn (agent) run."""

from __future__ import annotations

import colorsys
import dataclasses
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from PIL import Image
from tiny_models import SMALL_OVERRIDES

from ardea.cli.main import main
from ardea.config import load_config
from ardea.data import Segment, Trajectory, TrajectoryBatch
from ardea.model import build_char_tokenizer
from ardea.trainer import Trainer
from ardea.trainer.trajectory_html import kept_steps, turn_colour, write_trajectories_html
from ardea.trainer.trajectory_samples import append_token_rows, token_rows

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def two_turn_batch(tokenizer) -> TrajectoryBatch:
    """'ab' prompt, 'cd' turn 0 (version 3), 'e' context, 'fg' turn 1 (version 4); a second
    row of another group; advantages set by hand, next-token aligned."""
    ids = tokenizer("abcdefg", add_special_tokens=False)["input_ids"]
    row = Trajectory(
        (
            Segment.prompt(ids[:2]),
            Segment.generated(ids[2:4], [-0.5, -0.25], version=3, turn=0),
            Segment.context(ids[4:5]),
            Segment.generated(ids[5:7], [-1.0, -2.0], version=4, turn=1),
        ),
        reward=1.0,
        group_id=7,
    )
    other = Trajectory((Segment.prompt(ids[:1]), Segment.generated(ids[1:2], [-0.1], version=3)))
    batch = TrajectoryBatch.from_trajectories([row, other], pad_token_id=tokenizer.pad_token_id)
    advantages = torch.arange(14, dtype=torch.float32).reshape(2, 7) / 10  # column t: token t+1
    return dataclasses.replace(batch, advantages=advantages)


def test_token_rows_hold_each_trained_tokens_own_numbers():
    tokenizer = build_char_tokenizer()
    rows = token_rows(two_turn_batch(tokenizer), tokenizer)
    first, second = rows
    assert "".join(first["tokens"]) == "abcdefg" and first["group"] == 7
    assert first["trained"] == [False, False, True, True, False, True, True]
    assert first["turn"] == [-1, -1, 0, 0, -1, 1, 1]
    assert first["logprob"] == [None, None, -0.5, -0.25, None, -1.0, -2.0]
    assert first["advantage"] == [None, None, 0.1, 0.2, None, 0.4, 0.5]  # token t: column t-1
    assert first["version"] == [None, None, 3, 3, None, 4, 4]
    assert second["tokens"] == ["a", "b"] and second["advantage"] == [None, 0.7]


def test_long_runs_keep_evenly_spaced_steps():
    assert kept_steps([1, 2, 3], limit=5) == [1, 2, 3]
    assert kept_steps(list(range(1, 11)), limit=4) == [1, 4, 7, 10]


class Spans(HTMLParser):
    """The token spans of a page: (class, attributes, text)."""

    def __init__(self):
        super().__init__()
        self.spans, self._open = [], None

    def handle_starttag(self, tag, attrs):
        kind = (dict(attrs).get("class") or "").split()[:1]
        if tag == "span" and kind in (["gen"], ["ctx"]):
            self._open = [kind[0], dict(attrs), ""]

    def handle_data(self, data):
        if self._open is not None:
            self._open[2] += data

    def handle_endtag(self, tag):
        if tag == "span" and self._open is not None:
            self.spans.append(tuple(self._open))
            self._open = None


def render(page: Path, out: Path) -> tuple[str, Image.Image]:
    """The DOM Chromium builds from ``page`` and its screenshot (headless, no network)."""
    assert CHROMIUM, "Debian's chromium is not installed: make setup-browser installs it"
    flags = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={out / 'profile'}", "--window-size=1200,900",
    ]  # fmt: skip
    url = page.resolve().as_uri()
    env = {**os.environ, "HOME": str(out)}
    dom = subprocess.run(
        [*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120, env=env
    ).stdout
    shot = out / "screenshot.png"
    subprocess.run([*flags, f"--screenshot={shot}", url], capture_output=True, timeout=120, env=env)
    return dom, Image.open(shot).convert("RGB")


def share_of(image: Image.Image, css_hsl: str) -> float:
    """The share of pixels within 6 of the colour ``hsl(h, s%, l%)``."""
    hue, sat, light = (float(x.rstrip("%")) for x in css_hsl[4:-1].split(","))
    rgb = colorsys.hls_to_rgb(hue / 360, light / 100, sat / 100)
    r, g, b = (round(255 * c) for c in rgb)
    raw = image.tobytes()  # RGB, 3 bytes a pixel
    pixels = [raw[i : i + 3] for i in range(0, len(raw), 3)]
    near = sum(abs(p[0] - r) <= 6 and abs(p[1] - g) <= 6 and abs(p[2] - b) <= 6 for p in pixels)
    return near / len(pixels)


RUN = [
    *SMALL_OVERRIDES,
    "model.compute_dtype=float32",
    "rollout.group_size=4",
    "trainer.batch_size=4",
    "trainer.max_steps=2",
    "trainer.warmup_steps=1",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "logging.log_every=1",
    "logging.progress=false",
    "logging.tensorboard=false",
]
SINGLE_TURN = ["algo.name=online_grpo", "rollout.max_new_tokens=6", "data.eval_size=4"]
AGENT = [
    "algo.name=online_ppo",
    "algo.ppo.gae_timestep_unit=turn",
    "data.task=null",
    "data.train_size=16",
    "data.eval_size=2",
    "agent.env=guess_number",
    "agent.env_args={high: 8}",
    "agent.max_turns=3",
    "rollout.max_new_tokens=3",
]


@pytest.mark.parametrize("kind", [SINGLE_TURN, AGENT], ids=["single-turn", "agent"])
def test_the_report_page_renders_in_chromium(tmp_path, kind):
    run_dir = tmp_path / "run"
    Trainer(load_config(None, [*RUN, *kind, f"trainer.output_dir={run_dir}"])).train()
    records = [json.loads(x) for x in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    assert {r["step"] for r in records} == {1, 2} and len(records) == 2 * 3
    (run_dir / "trajectories.html").unlink()  # drawn at the end of training; now by report
    assert main(["report", str(run_dir)]) == 0
    dom, shot = render(run_dir / "trajectories.html", tmp_path)
    spans = Spans()
    spans.feed(dom)
    trained = [s for s in spans.spans if s[0] == "gen"]
    context = [s for s in spans.spans if s[0] == "ctx"]
    # every token of the logged rows is one span, trained ones as the records say
    assert len(spans.spans) == sum(len(r["tokens"]) for r in records)
    assert len(trained) == sum(sum(r["trained"]) for r in records) and context
    for _, attrs, _ in trained:
        assert attrs["title"].startswith(f"turn {attrs['data-turn']} · logprob ")
        assert float(attrs["data-logprob"]) <= 0 and attrs["data-version"] in ("0", "1")
    turns = {int(a["data-turn"]) for _, a, _ in trained}
    assert turns == {0} if kind is SINGLE_TURN else len(turns) >= 2
    assert dom.count('<section class="step"') == 2
    assert shot.size == (1200, 900)
    assert share_of(shot, turn_colour(0)) > 0.001  # turn 0's highlight is on screen


def test_a_run_without_rl_steps_has_no_page(tmp_path):
    append_token_rows(tmp_path, 1, [])
    assert write_trajectories_html(tmp_path) is None
