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
from ardea.model.dtype_probe import FORCE_ENV

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on the two cores: each worker's subprocesses (the CLI's
    # runs, vLLM's server) get one thread too. Two threads each would oversubscribe the
    # cores, and an OpenMP thread spin-waiting on a descheduled one stalls a run for minutes.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


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


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def auto_compute_dtype(request):
    """``compute_dtype=auto``'s answer, forced (``$ARDEA_AUTO_COMPUTE_DTYPE``) to each of
    bfloat16 and float32 in turn, for this process and every process it starts.

    A test whose expectation holds whatever ``auto`` picks, but which runs with ``auto``
    (exact resume, a run's outcome), asks for this fixture: it then runs under both answers
    on every machine, so a CPU where bf16 wins (an AMX Xeon) is not the first to find a
    failure that a CPU where float32 wins never shows, nor the reverse. Module-scoped: a
    module's shared runs are built once per answer."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(FORCE_ENV, request.param)
        yield request.param


#: the suite's longest test (minutes): started first, so that under ``-n 2`` the other worker
#: runs the rest of the suite meanwhile instead of waiting for it at the end
LONGEST = "tests/cli/test_default_recipe.py"
#: directories whose modules share a session fixture, run by one worker as one unit: the
#: vLLM tests share one real vLLM server
SHARED_UNITS = ("tests/vllm_engine/",)


def pytest_collection_modifyitems(config, items):
    """Work starts with the longest test, then the slow ones (the order of the work units
    under ``-n 2`` is the collection order)."""

    def order(item):
        path = item.nodeid.split("::")[0]
        return 0 if path == LONGEST else 1 if item.get_closest_marker("slow") else 2

    items.sort(key=order)


def pytest_xdist_make_scheduler(config, log):
    """``make test`` runs two workers (pytest-xdist). Every module is one unit of work that
    one worker runs whole, so a module's fixtures (a trained run, a torchrun launch) are
    built once; the modules of a SHARED_UNITS directory form one unit together."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return next((d for d in SHARED_UNITS if path.startswith(d)), path)

    return ModuleUnits(config, log)
