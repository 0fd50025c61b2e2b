"""Run under ``torchrun --nproc-per-node 2`` by test_row_shards.py: each rank pins a rollout of
``N`` rows through :class:`ardea.trainer.row_shards.RowShards` (a tiny policy's log-probs
with its top 3 tokens, and the log-probs alone) and writes what it got, its share and the
training FLOPs it counted to ``OUT/rank<r>.pt``.

    python -m torch.distributed.run --standalone --nproc-per-node 2 row_shards_worker.py OUT N
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "trainer" / "strategies")]

from strategy_testing import rollout_batch, tiny_policy  # noqa: E402

from ardea.model import sequence_logprobs  # noqa: E402
from ardea.model.flops import COUNTER  # noqa: E402
from ardea.trainer.row_shards import RowShards  # noqa: E402

LENGTHS = [9, 5, 12, 7, 10, 6, 11, 8]  # tokens per row (prompt 3), the first N are pinned


def batch(rows: int):
    return rollout_batch(LENGTHS[:rows], 3, [float(i) for i in range(rows)])


def main(out: Path, rows: int) -> None:
    dist.init_process_group("gloo")
    shards = RowShards(dist.get_rank(), dist.get_world_size())
    policy, rollout = tiny_policy().eval(), batch(rows)
    with torch.no_grad():
        before = COUNTER.totals()
        scores = shards.map(
            rollout, lambda b: sequence_logprobs(policy, **b.model_inputs(), top_logprobs=3)
        )
        flops = COUNTER.since(before)["train"]
        alone = shards.map(
            rollout, lambda b: sequence_logprobs(policy, **b.model_inputs()).logprobs
        )
    torch.save(
        {"logprobs": scores.logprobs, "top_ids": scores.top_ids, "top_logprobs": scores.top_logprobs,
         "aux_loss": scores.aux_loss, "alone": alone, "share": list(shards.share(rows)), "flops": flops},
        out / f"rank{shards.rank}.pt",
    )  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
