"""The random-number states a checkpoint keeps come back from its file: after a resume the
global Python and torch generators continue where the saving run's did. (Training draws from
its own seeded generators; the global ones feed e.g. LoRA dropout and unseeded sampling, so
a resume that skipped them would pass every end-to-end resume test and still differ there.)"""

import random

import torch

from ardea.trainer.state import restore_rng_state, rng_state


def test_the_global_generators_continue_after_a_checkpoint_round_trip(tmp_path):
    random.seed(1)
    torch.manual_seed(1)
    random.random(), torch.rand(3)  # somewhere in the middle of a run
    torch.save({"rng": rng_state()}, tmp_path / "trainer_state.pt")
    expected = random.random(), torch.rand(3)  # what the run drew next
    random.seed(99)  # a new process: other states
    torch.manual_seed(99)
    restore_rng_state(torch.load(tmp_path / "trainer_state.pt", weights_only=True)["rng"])
    assert random.random() == expected[0]
    assert torch.equal(torch.rand(3), expected[1])
