"""model.compute_dtype: which dtype forwards compute in, on which hardware."""

import pytest
import torch
from tiny_models import small_model

import ardea.model.precision as precision
from ardea.errors import ConfigError
from ardea.model import Precision

CPU = torch.device("cpu")


def test_a_cpu_always_has_bfloat16_kernels_to_time():
    """Which is faster is measured (tests/model/test_dtype_probe.py), not read from flags."""
    assert precision.has_bfloat16(CPU)
    assert not precision.has_bfloat16(torch.device("meta"))


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


def _tiny_sdpa_model():
    from ardea.model import build_char_tokenizer

    tokenizer = build_char_tokenizer(model_max_length=64)
    return small_model(tokenizer, num_layers=1, max_position_embeddings=512)


@pytest.mark.parametrize(
    ("compute", "attention", "seq_len", "inside"),
    [
        (torch.bfloat16, "auto", 70, "eager"),  # 16-bit on CPU, short: eager
        (torch.bfloat16, "auto", 128, "eager"),
        (torch.bfloat16, "auto", 129, "sdpa"),  # longer: the model's own kernel
        (torch.float32, "auto", 70, "sdpa"),  # float32: the model's own kernel
        (torch.float32, "eager", 300, "eager"),  # forced
        (torch.bfloat16, "sdpa", 70, "sdpa"),
    ],
)
def test_forward_picks_the_attention_kernel_and_restores_it(compute, attention, seq_len, inside):
    model = _tiny_sdpa_model()
    precision = Precision(CPU, torch.float32, compute, attention)
    seen = []
    with precision.forward(model, seq_len):
        seen.append(model.config._attn_implementation)
        seen.append(torch.is_autocast_enabled("cpu"))
    assert seen == [inside, compute != torch.float32]
    assert model.config._attn_implementation == "sdpa"


def test_eager_and_sdpa_give_the_same_logprobs():
    from ardea.model import sequence_logprobs

    model = _tiny_sdpa_model()
    ids = torch.randint(3, 60, (3, 20))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding
    kernels = {}
    for attention in ("sdpa", "eager"):
        with Precision(CPU, torch.float32, torch.float32, attention).forward(model, 20):
            kernels[attention] = sequence_logprobs(model, ids, mask).logprobs
    torch.testing.assert_close(kernels["eager"], kernels["sdpa"], rtol=0, atol=1e-5)


def test_unknown_attention_kernel_is_refused_by_name():
    with pytest.raises(ConfigError, match="model.attn_implementation='flash'"):
        Precision.resolve("auto", CPU, torch.float32, "flash")
