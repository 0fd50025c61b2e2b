"""``torchrun --nproc-per-node 2 torchrun_families.py ROOT MODELS FAMILY...``: the support
matrix's torchrun column in one launch (the start-up paid once): for each family, the
online GRPO cell (matrix_cells.py) under DDP, two processes, in ``ROOT/<family>``; a
family that fails writes its error to ``ROOT/<family>/error.txt`` and the next one runs."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from families.matrix_cells import run_cell  # noqa: E402


def main(root: Path, models: Path, families: list[str]) -> None:
    rank = int(os.environ.get("RANK", "0"))
    for family in families:
        out = root / family
        try:
            run_cell(models / family, "grpo", out, ["trainer.distributed=ddp"])
        except Exception:  # noqa: BLE001 - recorded for the test, which names it
            if rank == 0:
                out.mkdir(parents=True, exist_ok=True)
                (out / "error.txt").write_text(traceback.format_exc())


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
