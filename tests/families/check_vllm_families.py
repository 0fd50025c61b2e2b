"""``python tests/families/check_vllm_families.py [FAMILY...]`` (from the repository root,
with .venv-vllm built): the support matrix's vLLM column, measured. For each family, the
online GRPO cell (matrix_cells.py) on launched vLLM servers (``rollout.engine=vllm``): a ✓
cell must train with behaviour log-probs within 1e-4 of the trainer's, a refusal cell must
fail naming its reason (model_families.REFUSALS). Not in the suite: a server start per
family costs about 18 s on a 2-core machine. Prints one line per family; exits 1 if a cell
is not what the page says."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from matrix_cells import run_cell  # noqa: E402
from model_families import FAMILIES, expected, save_family  # noqa: E402

VLLM = ["rollout.engine=vllm", "rollout.vllm.launch=true"]
BOUND = 1e-4  # vLLM's kernels against the trainer's, float32


def check(family: str, root: Path) -> str | None:
    """None when the family's vLLM cell is what the page says, else what it was."""
    refusal = expected(family, "vllm")
    model = save_family(family, root / family / "model")
    try:
        steps = run_cell(model, "grpo", root / family / "run", VLLM)
    except Exception as error:  # noqa: BLE001 - compared with the page's refusal
        if refusal is not None and refusal[1] in str(error):
            return None
        return f"failed: {str(error)[:800]}"
    if refusal is not None:
        return "trained, but the page says it is refused"
    worst = max(step["mismatch/abs_diff_max"] for step in steps)
    return None if len(steps) == 2 and worst <= BOUND else f"mismatch {worst:.2e} > {BOUND}"


def main(families: list[str]) -> int:
    wrong = 0
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            started = time.perf_counter()
            problem = check(family, Path(tmp))
            wrong += problem is not None
            seconds = time.perf_counter() - started
            print(f"{family:12s} {seconds:5.1f} s  {problem or 'as the page says'}", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(FAMILIES)))
