"""Where a run's training time goes: every phase of the step (``perf/time_<phase>``),
averaged over the steps of this invocation, and what no phase accounts for (``other``:
logging, the progress bar, Python between phases); and the step's *floor*.

The floor is the time the step's matmul FLOPs (counted as the work happens,
:mod:`ardea.model.flops`: training forwards and backwards, in-process decoding) would take
at the rates of the run's compute dtype measured at the run's own two shapes
(:func:`ardea.model.dtype_probe.dtype_rates`: the ``compute_dtype=auto`` probe's figures,
or timed at the end of the run). The probe sizes its training product from the config
before any batch exists (a micro-batch of the longest sequences); where the run's training
forwards averaged another row count (shorter sequences), the training rate is timed again
at that count at the end of the run, so the floor is the rate of products of the size the
run multiplied::

    floor = train FLOPs / train-shape rate + decode FLOPs / decode-shape rate

``percent_of_step = 100 · floor / step`` says how much of the step is matmul work at full
speed (the rest: Python, small ops, padding, attention and the LM head running below the
MLP's rate); ``decode_percent_of_generate`` the same for the ``generate`` phase alone (when
generation runs in this process and in the step, not in the background).

Written to ``results.json`` under ``profile`` and printed at the end of ``ardea train``."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console
from rich.table import Table

from ardea.model import Precision
from ardea.model.dtype_probe import ProbeShapes, dtype_rates
from ardea.model.flops import FlopCounter

PREFIX = "perf/time_"


class StepProfile:
    """Seconds per phase and FLOPs, summed over steps (one :meth:`add` per training step);
    ``shapes``: the run's matmul shapes, where the floor's rates are measured."""

    def __init__(self, shapes: ProbeShapes | None = None) -> None:
        self.steps = 0
        self.seconds = 0.0
        self.phases: dict[str, float] = {}
        self.flops = dict.fromkeys(FlopCounter.KINDS, 0.0)
        self.shapes = shapes

    def add(
        self, metrics: dict[str, float], seconds: float, flops: dict[str, float] | None = None
    ) -> None:
        """One step: its ``perf/time_*`` metrics, its wall time and its ``train`` and
        ``decode`` FLOPs."""
        self.steps += 1
        self.seconds += seconds
        for kind, value in (flops or {}).items():
            self.flops[kind] += value
        for name, value in metrics.items():
            if name.startswith(PREFIX):
                phase = name[len(PREFIX) :]
                self.phases[phase] = self.phases.get(phase, 0.0) + value

    def rates(self, precision: Precision) -> dict[str, float] | None:
        """GFLOP/s of ``precision``'s compute dtype at the run's shapes (``train``,
        ``decode``) and the rows of the training product timed (``train_rows``), or None
        when there is no floor to show (no step, no shapes, nothing counted)."""
        counted = self.flops["train"] or self.flops["decode"]
        if not self.steps or self.shapes is None or not counted:
            return None
        passes = self.flops["train_passes"]
        rows = round(self.flops["train_rows"] / passes) if passes else self.shapes.train_tokens
        shapes = dataclasses.replace(self.shapes, train_tokens=max(1, rows))
        rates = dtype_rates(
            precision.device, precision.compute, precision.params, shapes, precision.probe,
            measured_shapes=self.shapes,
        )  # fmt: skip
        return {**rates, "train_rows": shapes.rows("train")}

    def summary(self, rates: dict[str, float] | None = None) -> dict[str, Any]:
        """``{"steps", "seconds_per_step", "phases": {name: {"seconds_per_step",
        "share"}}}``, ``other`` last, and with ``rates`` (GFLOP/s per ``train`` /
        ``decode``) the ``floor`` (module docstring); empty before any step."""
        if not self.steps:
            return {}
        other = max(0.0, self.seconds - sum(self.phases.values()))
        phases = {**self.phases, "other": other}
        total = max(self.seconds, 1e-12)
        summary = {
            "steps": self.steps,
            "seconds_per_step": round(self.seconds / self.steps, 6),
            "phases": {
                name: {
                    "seconds_per_step": round(value / self.steps, 6),
                    "share": round(value / total, 4),
                }
                for name, value in phases.items()
            },
        }
        if rates is not None:
            summary["floor"] = self._floor(rates)
        return summary

    def _floor(self, rates: dict[str, float]) -> dict[str, Any]:
        kinds = ("train", "decode")
        gflop = {kind: self.flops[kind] / self.steps / 1e9 for kind in kinds}
        seconds = {kind: gflop[kind] / rates[kind] for kind in kinds}
        floor = sum(seconds.values())
        result = {
            "train_gflop_per_step": round(gflop["train"], 4),
            "decode_gflop_per_step": round(gflop["decode"], 4),
            "rates_gflops": {kind: round(rates[kind], 2) for kind in kinds},
            "seconds_per_step": round(floor, 6),
            "percent_of_step": round(100 * floor * self.steps / max(self.seconds, 1e-12), 2),
        }
        if "train_rows" in rates:
            result["train_rows"] = int(rates["train_rows"])
        generate = self.phases.get("generate", 0.0) / self.steps
        if gflop["decode"] and generate > 0:
            result["decode_percent_of_generate"] = round(100 * seconds["decode"] / generate, 2)
        return result


def print_profile(summary: dict[str, Any], console: Console | None = None) -> None:
    """The profile as a table: each phase's seconds per step and share of the step; then
    the floor's line."""
    if not summary:
        return
    table = Table(
        title=f"time per training step: {summary['seconds_per_step']:.4f} s over "
        f"{summary['steps']} steps"
    )
    table.add_column("phase")
    table.add_column("s / step", justify="right")
    table.add_column("share", justify="right")
    for name, phase in summary["phases"].items():
        table.add_row(name, f"{phase['seconds_per_step']:.4f}", f"{phase['share']:.1%}")
    console = console or Console()
    console.print(table)
    floor = summary.get("floor")
    if floor:
        rates = floor["rates_gflops"]
        rows = f" ({floor['train_rows']}-row products)" if "train_rows" in floor else ""
        parts = [
            f"training {floor['train_gflop_per_step']:.3g} GFLOP at {rates['train']:.1f} "
            f"GFLOP/s{rows}"
        ]
        if floor["decode_gflop_per_step"]:  # 0: no generation, or in another process (vLLM)
            parts.append(
                f"decoding {floor['decode_gflop_per_step']:.3g} GFLOP at "
                f"{rates['decode']:.1f} GFLOP/s"
            )
        if "decode_percent_of_generate" in floor:
            parts.append(f"generate at {floor['decode_percent_of_generate']:.1f} % of its floor")
        console.print(
            f"floor: {floor['seconds_per_step']:.4f} s per step = "
            f"{floor['percent_of_step']:.1f} % of the step ({'; '.join(parts)})"
        )
