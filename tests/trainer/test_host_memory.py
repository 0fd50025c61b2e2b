"""``trainer.host_memory``: freed host memory kept for reuse (glibc's thresholds raised),
checked by the page faults a loop of large allocations takes in a fresh process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ardea.config.loader import load_config
from ardea.errors import ConfigError
from ardea.trainer import Trainer, host_memory
from ardea.trainer.host_memory import keep_freed_memory

# Two 24 MiB blocks written and freed, twenty times, with glibc's own malloc: by default
# glibc raises its mmap threshold to 24 MiB after the first free and its trim threshold to
# twice that, so the 48 MiB free at the heap's top goes back to the system every time and
# the next blocks fault their pages in again; kept, they are reused from the second round on.
FAULTS = """
import ctypes, importlib.util, resource, sys
# the module alone, without importing the trainer package and all it imports
spec = importlib.util.spec_from_file_location("host_memory", sys.argv[2])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
kept = module.keep_freed_memory(sys.argv[1])
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
size, faults = 24 << 20, []
for _ in range(20):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(size) for _ in range(2)]
    for block in blocks:
        libc.memset(block, 1, size)
    for block in blocks:
        libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(kept, *faults)
"""


def _faults(mode: str) -> tuple[bool, list[int]]:
    """Whether ``mode`` kept freed blocks, and the page faults of each round after the first."""
    command = [sys.executable, "-c", FAULTS, mode, host_memory.__file__]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()
    return out[0] == "True", [int(n) for n in out[2:]]


@pytest.mark.skipif(host_memory._glibc() is None, reason="the C library is not glibc")
def test_kept_memory_is_reused_without_page_faults():
    kept, faults = _faults("keep")
    assert kept
    assert sum(faults) < 20  # the first round's pages reused (a stray fault or two at most)
    released, faults = _faults("release")
    assert not released
    # every round's 48 MiB faulted in again: 12,288 4-KiB pages (fewer were they huge pages,
    # but at least one per block)
    assert min(faults) >= 2


def test_keep_without_glibc_is_an_error_naming_the_field(monkeypatch):
    monkeypatch.setattr(host_memory, "_glibc", lambda: None)
    with pytest.raises(RuntimeError, match="trainer.host_memory=keep"):
        keep_freed_memory("keep")
    assert keep_freed_memory("auto") is False


def test_the_trainer_applies_the_setting(monkeypatch, tmp_path):
    monkeypatch.setattr(host_memory, "_glibc", lambda: None)
    config = load_config(None, ["trainer.host_memory=keep", f"trainer.output_dir={tmp_path}"])
    with pytest.raises(RuntimeError, match="trainer.host_memory=keep"):
        Trainer(config)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="trainer.host_memory='yes'"):
        keep_freed_memory("yes")
    with pytest.raises(ConfigError, match="trainer.host_memory"):
        load_config(None, ["trainer.host_memory=yes"])
