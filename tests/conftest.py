"""Suite-wide set-up: the character tokenizer, one torch thread per test, and a cache
directory of the suite's own (compute_dtype=auto's measurements stay out of ~/.cache).

Tiny tensors run fastest on one thread, results do not depend on the thread count, and
two OpenMP threads on a busy 2-core machine can be ~100x slower (spin-waiting on a
descheduled thread).
"""

import os

import pytest
import torch

from ardea.model import build_char_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    """The character tokenizer (tests must not mutate it)."""
    return build_char_tokenizer()


@pytest.fixture(autouse=True)
def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session", autouse=True)
def _own_cache_dir(tmp_path_factory):
    os.environ["ARDEA_CACHE_DIR"] = str(tmp_path_factory.mktemp("ardea-cache"))
