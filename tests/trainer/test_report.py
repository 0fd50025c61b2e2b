"""``report.png``'s panels: which metrics a run's records draw, and the sampled held-out
metrics together in one panel."""

import json

from ardea.trainer.report import _panels, draw_report


def test_sampled_metrics_share_one_panel_after_the_greedy_accuracy(tmp_path):
    records = [
        {"step": 0, "train/loss": 2.0, "eval/accuracy": 0.1, "eval/avg@4": 0.2,
         "eval/avg@4_se": 0.05, "eval/pass@2": 0.3, "eval/maj@2": 0.25},
        {"step": 10, "train/loss": 1.0, "eval/accuracy": 0.5, "eval/avg@4": 0.6,
         "eval/avg@4_se": 0.04, "eval/pass@2": 0.7, "eval/maj@2": 0.65},
    ]  # fmt: skip
    panels = _panels(records)
    assert list(panels) == ["train/loss", "eval/accuracy", "eval/sampled"]
    title, lines = panels["eval/sampled"]
    assert "sampled" in title
    assert lines == {"avg@4": [(0, 0.2), (10, 0.6)], "maj@2": [(0, 0.25), (10, 0.65)],
                     "pass@2": [(0, 0.3), (10, 0.7)]}  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert draw_report(tmp_path).stat().st_size > 10_000
    assert "eval/sampled" not in _panels([{"step": 0, "eval/accuracy": 0.1}])
