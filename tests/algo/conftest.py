"""Shared fixtures for the algorithm-core tests."""

import pytest

from ardea.algo import c_kernel_available


@pytest.fixture(params=["c", "torch"])
def backend(request):
    """Run a GAE test once per back end of the recurrence (compiled C loop, PyTorch loop)."""
    if request.param == "c" and not c_kernel_available():
        pytest.skip("no C compiler: the compiled GAE kernel is unavailable")
    return request.param
