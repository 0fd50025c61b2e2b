"""The compiled GAE kernel: compilation, caching, fallback to the PyTorch loop."""

import pytest
import torch

import ardea.algo._ckernel as ckernel
from ardea.algo import c_kernel_available, compute_token_level_gae, compute_turn_level_gae

GEN = torch.Generator().manual_seed(0)
ARGS = dict(
    rewards=torch.randn(3, 50, generator=GEN),
    values=torch.randn(3, 50, generator=GEN),
    loss_mask=torch.rand(3, 50, generator=GEN) > 0.3,
    seq_no_eos_mask=torch.tensor([True, False, True]),
    bootstrap_values=torch.randn(3, generator=GEN),
    discount=0.97,
    gae_lambda=torch.tensor([0.9, 0.5, 1.0]),
)
TURN_IDS = torch.arange(50).div(7, rounding_mode="floor").expand(3, 50)


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
    """Forget the loaded library and compile into an empty cache directory."""
    monkeypatch.setattr(ckernel, "_lib", None)
    monkeypatch.setattr(ckernel, "_failed", False)
    monkeypatch.setenv("ARDEA_KERNEL_CACHE", str(tmp_path))
    return tmp_path


def test_compiles_into_the_cache_and_matches_the_torch_loop(fresh_kernel, monkeypatch):
    if not c_kernel_available():
        pytest.skip("no C compiler")
    assert len(list(fresh_kernel.glob("ardea_kernels_*.so"))) == 1
    fast, _ = compute_token_level_gae(**ARGS, backend="c")
    slow, _ = compute_token_level_gae(**ARGS, backend="torch")
    torch.testing.assert_close(fast, slow, rtol=0, atol=0)
    monkeypatch.setattr(ckernel, "_lib", None)  # a second process reuses the cached file
    monkeypatch.setattr(ckernel, "_compile", lambda target: pytest.fail("recompiled"))
    assert c_kernel_available()


def test_turn_level_back_ends_agree():
    turn = dict(ARGS, turn_ids=TURN_IDS)
    slow = compute_turn_level_gae(**turn, backend="torch")
    fast = compute_turn_level_gae(**turn)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_missing_compiler_falls_back_to_torch(fresh_kernel, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert not c_kernel_available()
    expected, _ = compute_token_level_gae(**ARGS, backend="torch")
    got, _ = compute_token_level_gae(**ARGS)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="compiled GAE kernel is unavailable"):
        compute_token_level_gae(**ARGS, backend="c")


def test_environment_switch_disables_the_kernel(monkeypatch):
    monkeypatch.setenv("ARDEA_DISABLE_C_KERNEL", "1")
    assert not c_kernel_available()
    got, _ = compute_token_level_gae(**ARGS)
    expected, _ = compute_token_level_gae(**ARGS, backend="torch")
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_half_precision_uses_the_torch_loop():
    half = {
        k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in ARGS.items()
    }
    adv, ret = compute_token_level_gae(**half)
    assert adv.dtype == ret.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="backend"):
        compute_token_level_gae(**ARGS, backend="cuda")
