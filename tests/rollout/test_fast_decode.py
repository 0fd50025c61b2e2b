"""The compact decode step: used for plain Qwen2 / Qwen3 / Llama decoders, never for what it does
not reproduce, and equal to the Hugging Face forward (fp32) or close to it (bf16)."""

import pytest
import torch
from rollout_models import EOS, PAD, make_model

from ardea.model import Precision
from ardea.rollout import InProcessEngine, SamplingParams
from ardea.rollout.engines.inprocess.fast_decode import fast_decoder

PROMPTS = [[5, 6, 7], [8, 9], [20, 21, 22, 23]]


@pytest.mark.parametrize(
    ("arch", "overrides", "fast"),
    [
        ("qwen2", {}, True),
        ("qwen3", {}, True),
        ("qwen3_moe", {}, False),  # mixtures of experts take the Hugging Face forward
        ("llama", {}, True),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, False),
        ("llama", {"mlp_bias": True}, False),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0}, False),
    ],
    ids=["qwen2", "qwen3", "qwen3-moe", "llama", "rope-scaling", "mlp-bias", "sliding-window"],
)
def test_only_plain_decoders_take_the_fast_step(arch, overrides, fast):
    assert (fast_decoder(make_model(arch, **overrides), None) is not None) == fast


def engine(model, fast: bool, precision=None) -> InProcessEngine:
    out = InProcessEngine(model, pad_token_id=PAD, eos_token_ids=[EOS], precision=precision)
    if not fast:
        out._fast = out._decoder.fast = None  # the Hugging Face forward at every step
    return out


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_fast_step_equals_the_hugging_face_forward_in_float32(arch):
    model = make_model(arch)
    params = SamplingParams(temperature=0.9, max_new_tokens=16, seed=4, n=3)
    fast, stock = (
        engine(model, True).generate(PROMPTS, params),
        engine(model, False).generate(PROMPTS, params),
    )
    for a, b in zip(fast, stock, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 2e-6


def test_weights_reach_the_fast_step_through_update_weights():
    model = make_model("qwen2", seed=0)
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    fast = engine(model, True)
    other = make_model("qwen2", seed=1)
    fast.update_weights(other.state_dict(), 1)
    assert [c.token_ids for c in fast.generate(PROMPTS, greedy)] == [
        c.token_ids for c in engine(other, False).generate(PROMPTS, greedy)
    ]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_bfloat16_compute_stays_close_to_the_float32_distribution(arch):
    """bf16 matmuls (fp32 parameters, as under autocast): the behaviour log-probs of the
    sampled tokens stay within 0.05 of the float32 engine's on the same tokens."""
    model = make_model(arch)
    bf16 = Precision(torch.device("cpu"), torch.float32, torch.bfloat16)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=7, n=2)
    low = engine(model, True, bf16).generate(PROMPTS, params)
    assert {c.version for c in low} == {0}
    rows = [c.prompt_ids + c.token_ids for c in low]
    width = max(map(len, rows))
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits.double(), -1)
    worst = 0.0
    for i, c in enumerate(low):
        start = len(c.prompt_ids) - 1
        exact = logp[i, torch.arange(start, start + len(c.token_ids)), torch.tensor(c.token_ids)]
        worst = max(
            worst, float((exact - torch.tensor(c.logprobs, dtype=torch.float64)).abs().max())
        )
    assert 1e-4 < worst < 0.05  # bf16 is visibly not fp32, and close to it


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_the_hugging_face_module_bit_for_bit(dtype):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    from ardea.rollout.engines.inprocess.fast_decode import _rms_norm

    gen = torch.Generator().manual_seed(3)
    module = Qwen2RMSNorm(96, eps=1e-6).to(dtype)
    with torch.no_grad():
        module.weight.copy_(torch.randn(96, generator=gen))
    x = (3 * torch.randn(16, 1, 96, generator=gen)).to(dtype)
    with torch.no_grad():
        assert torch.equal(_rms_norm(x, module.weight, 1e-6), module(x))


def test_rope_on_query_and_key_heads_at_once_equals_rotate_half():
    """The step's rotate (x cos + swap_halves(x) (−sin, +sin)) against transformers' own
    apply_rotary_pos_emb on the same bf16 heads and float32 factors: equal bit for bit."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    from ardea.rollout.engines.inprocess.fast_decode import rotate

    model = make_model("qwen2")
    fast = fast_decoder(model, torch.bfloat16)
    positions = torch.tensor([0, 3, 17, 40])
    gen = torch.Generator().manual_seed(5)
    d = fast.head_dim
    heads = (torch.randn(4, 5, 1, d, generator=gen)).bfloat16()  # (N, H, 1, D)
    cos, signed = fast._rope(positions)
    ours = rotate(heads.view(4, 5, 2, d // 2), cos, signed).reshape(4, 5, 1, d)
    ref_cos, ref_sin = model.model.rotary_emb(heads.float(), positions[:, None])  # (N, 1, D)
    expected, _ = apply_rotary_pos_emb(heads, heads, ref_cos, ref_sin, unsqueeze_dim=1)
    assert torch.equal(ours, expected)
