"""No host sync in the training step's hot loop: every micro-batch's forward and backward
reads nothing back from the device but what its shapes need, and the update's metrics are
read once, at its end.

Counted on CPU with a dispatch mode: the ops that read a device value on the host
(``aten::_local_scalar_dense``: ``item()``, ``float()``, ``bool()`` of a tensor; ``nonzero``
and ``masked_select``, whose output shape is data-dependent; indexing with a boolean mask;
``equal``, ``is_nonzero``) and every ``Tensor.tolist`` (no dispatched op, a sync on a GPU).
What remains, per micro-batch:

- ardea: 1 per log-prob pass, the scored positions' ``nonzero`` (how many tokens are scored
  is data-dependent); 2 per update: its normalising counts (tokens, sequences, reward sums:
  one read before its first forward) and its metrics
  (:func:`ardea.trainer.step.updates.read_metrics`, after its last backward);
- transformers: 2 per model forward, its SDPA mask builder asking whether the padding mask
  is all ones (to skip the mask); not ardea's to remove.
"""

from __future__ import annotations

import collections
import traceback

import pytest
import torch
from online_testing import RUN
from torch.utils._python_dispatch import TorchDispatchMode

from ardea.config import load_config
from ardea.trainer import Trainer
from ardea.trainer.step.updates import Updater

SYNC_OPS = {
    "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::is_nonzero",
    "aten::equal",
}  # fmt: skip


class CountSyncs(TorchDispatchMode):
    """Counts the host syncs of the ops run under it, by whose code asked: ``transformers``
    (a frame of the transformers package on the stack) or ``ardea``."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        masked = name == "aten::index" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or [])
        )
        if name in SYNC_OPS or masked:
            self.counts[self.owner()] += 1
        return func(*args, **(kwargs or {}))

    @staticmethod
    def owner() -> str:
        files = [frame.filename for frame in traceback.extract_stack()]
        return "transformers" if any("/transformers/" in f for f in files) else "ardea"


def count_update_syncs(tmp_path, monkeypatch, *overrides: str) -> tuple[dict, int, int]:
    """One training step's host syncs inside its updates' forward and backward loops:
    ``(syncs by owner, micro-batches, updates)``."""
    trainer = Trainer(load_config(None, [*RUN, "trainer.max_steps=1",
                                         f"trainer.output_dir={tmp_path}", *overrides]))  # fmt: skip
    counter, seen = CountSyncs(), {"micro_batches": 0, "updates": 0}
    forward_backward = Updater._forward_backward
    tolist = torch.Tensor.tolist

    def counted_tolist(self, *args, **kwargs):
        counter.counts["ardea"] += 1
        return tolist(self, *args, **kwargs)

    def counted(self, micro_batches, update=0):
        seen["micro_batches"] += len(micro_batches)
        seen["updates"] += 1
        monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
        try:
            with counter:
                return forward_backward(self, micro_batches, update)
        finally:
            monkeypatch.setattr(torch.Tensor, "tolist", tolist)

    monkeypatch.setattr(Updater, "_forward_backward", counted)
    trainer.train_step()
    return dict(counter.counts), seen["micro_batches"], seen["updates"]


@pytest.mark.parametrize(
    ("name", "forwards"),  # model forwards per micro-batch: the policy (and the critic)
    [("online_grpo", 1), ("online_ppo", 2)],
)
def test_the_update_loop_reads_back_only_what_shapes_need(
    name, forwards, tmp_path, monkeypatch, reward_module
):
    """A KL term, 2 epochs x 2 mini-batches x 2 micro-batches, and the engine's behaviour
    log-probs (mismatch metrics): the budget of the module docstring, not a sync more."""
    syncs, micro_batches, updates = count_update_syncs(
        tmp_path, monkeypatch, f"algo.name={name}", "algo.ppo.kl_ctl=0.05",
        "algo.ppo_epochs=2", "algo.ppo_mini_batches=2", "trainer.grad_accum_steps=2",
    )  # fmt: skip
    assert updates == 4 and micro_batches == 8
    assert syncs.get("ardea", 0) == micro_batches + 2 * updates
    assert syncs.get("transformers", 0) <= 2 * forwards * micro_batches


def test_mismatch_metrics_are_computed_in_the_first_update_only(
    tmp_path, monkeypatch, reward_module
):
    """Only the first update's mismatch/* are logged (the state before any update), so
    later updates do not compute them."""
    import ardea.trainer.strategies.policy_gradient as policy_gradient

    calls = []
    real = policy_gradient.mismatch_metrics
    monkeypatch.setattr(
        policy_gradient, "mismatch_metrics", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    trainer = Trainer(load_config(None, [*RUN, "trainer.max_steps=1", "algo.ppo_epochs=3",
                                         f"trainer.output_dir={tmp_path}"]))  # fmt: skip
    metrics = trainer.train_step()
    assert len(calls) == 1  # one micro-batch in the first of three updates
    assert any(k.startswith("mismatch/") for k in metrics)  # and still logged
