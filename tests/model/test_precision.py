"""model.compute_dtype: which dtype forwards compute in, on which hardware."""

import pytest
import torch

import ardea.model.precision as precision
from ardea.errors import ConfigError
from ardea.model import Precision

CPU = torch.device("cpu")


@pytest.mark.parametrize(("fast", "expected"), [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_is_bfloat16_only_where_it_is_fast(monkeypatch, fast, expected):
    monkeypatch.setattr(precision, "fast_bfloat16", lambda device: fast)
    assert Precision.resolve("auto", CPU, torch.float32).compute == expected
    # bf16 parameters compute in bf16 whatever the hardware
    assert Precision.resolve("auto", CPU, torch.bfloat16).compute == torch.bfloat16


def test_explicit_dtypes_and_errors():
    assert Precision.resolve("float32", CPU, torch.float32).compute == torch.float32
    assert Precision.resolve("bfloat16", CPU, torch.float32).compute == torch.bfloat16
    with pytest.raises(ConfigError, match=r"model.compute_dtype=float32 is more precise than"):
        Precision.resolve("float32", CPU, torch.bfloat16)
    with pytest.raises(ConfigError, match=r"model.compute_dtype='int8'; choose one of auto"):
        Precision.resolve("int8", CPU, torch.float32)


def test_autocast_runs_matmuls_in_the_compute_dtype_only_when_it_differs():
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with Precision(CPU, torch.float32, torch.bfloat16).autocast():
        assert torch.nn.functional.linear(x, w).dtype == torch.bfloat16
    with Precision(CPU, torch.float32, torch.float32).autocast():
        assert torch.nn.functional.linear(x, w).dtype == torch.float32


def test_the_config_field_is_validated():
    from ardea.config import load_config

    with pytest.raises(ConfigError, match=r"model.compute_dtype='fp8' is not allowed"):
        load_config(None, ["model.compute_dtype=fp8"])
