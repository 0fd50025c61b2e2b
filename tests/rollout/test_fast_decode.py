"""The compact decode step: used for plain Qwen2 / Qwen3 / Llama decoders and their mixtures of
experts, never for what it does not reproduce, and equal to the Hugging Face forward (fp32) or
close to it (bf16)."""

import pytest
import torch
from rollout_models import EOS, PAD, make_model

from ardea.model import Precision
from ardea.model.autocast_experts import follow_autocast
from ardea.rollout import InProcessEngine, SamplingParams
from ardea.rollout.engines.inprocess.fast_decode import fast_decoder
from ardea.rollout.engines.inprocess.fast_experts import RoutedExperts

PROMPTS = [[5, 6, 7], [8, 9], [20, 21, 22, 23]]
#: RoPE scalings whose frequencies are fixed at load (factors chosen to bind within 64 positions)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16, "rope_theta": 10000.0}  # fmt: skip
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "rope_theta": 10000.0}  # fmt: skip


@pytest.mark.parametrize(
    ("arch", "overrides", "fast"),
    [
        ("qwen2", {}, True),
        ("qwen3", {}, True),
        ("qwen3_moe", {}, True),
        ("qwen2_moe", {}, True),
        ("mixtral", {}, True),
        ("qwen3_moe", {"experts_implementation": "eager"}, False),  # per-expert F.linear
        ("llama", {}, True),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, True),
        ("llama", {"rope_scaling": LLAMA3}, True),
        ("qwen3", {"rope_scaling": YARN}, True),
        ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, False),
        ("llama", {"mlp_bias": True}, False),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0}, False),
    ],
    ids=[
        "qwen2",
        "qwen3",
        "qwen3-moe",
        "qwen2-moe",
        "mixtral",
        "eager-experts",
        "llama",
        "linear-rope",
        "llama3-rope",
        "yarn",
        "dynamic-rope",
        "mlp-bias",
        "sliding-window",
    ],
)
def test_only_plain_decoders_take_the_fast_step(arch, overrides, fast):
    assert (fast_decoder(make_model(arch, **overrides), None) is not None) == fast


def engine(model, fast: bool, precision=None) -> InProcessEngine:
    out = InProcessEngine(model, pad_token_id=PAD, eos_token_ids=[EOS], precision=precision)
    if not fast:
        out._fast = out._decoder.fast = None  # the Hugging Face forward at every step
    return out


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [("qwen2", {}), ("qwen3", {}), ("llama", {}), ("llama", {"rope_scaling": LLAMA3}),
     ("qwen3", {"rope_scaling": YARN}), ("qwen3_moe", {}), ("qwen2_moe", {}), ("mixtral", {})],
    ids=["qwen2", "qwen3", "llama", "llama3-rope", "yarn", "qwen3-moe", "qwen2-moe", "mixtral"],
)  # fmt: skip
def test_fast_step_equals_the_hugging_face_forward_in_float32(arch, overrides):
    model = make_model(arch, **overrides)
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


@pytest.mark.parametrize("fast", [True, False], ids=["compact-step", "hugging-face-step"])
def test_new_weights_reach_an_moe_decoding_in_bf16(fast):
    """Both paths keep the experts cast to bf16 between steps (the step's copies, the
    Hugging Face forward's kept casts): update_weights must reach them."""
    bf16 = Precision(torch.device("cpu"), torch.float32, torch.bfloat16)
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    old, new = make_model("qwen3_moe", seed=0), make_model("qwen3_moe", seed=1)
    updated = engine(old, fast, bf16)
    before = [c.token_ids for c in updated.generate(PROMPTS, greedy)]
    updated.update_weights(new.state_dict(), 1)
    after = [c.token_ids for c in updated.generate(PROMPTS, greedy)]
    assert after != before
    assert after == [c.token_ids for c in engine(new, fast, bf16).generate(PROMPTS, greedy)]


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


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe", "mixtral"])
def test_experts_on_the_step_compute_what_the_trainers_block_does_in_bf16(arch):
    """The step's batched experts (weights cast once) against the model's own MoE block under
    bf16 autocast, as the trainer runs it (experts switched to the compute dtype): the same
    experts, and outputs equal up to the order a kernel sums in. Both accumulate in float32
    and round each bf16 intermediate once; another order changes a rounding by at most an ulp
    (2^-8 relative), which the gated product and the down projection carry to a few ulps of
    the output's scale: 2^-6 of its largest entry bounds it (measured: equal bit for bit on an
    AMX Xeon)."""
    model = make_model(arch)
    follow_autocast(model)
    block = model.model.layers[0].mlp
    x = torch.randn(32, 1, 64, generator=torch.Generator().manual_seed(2))
    step = RoutedExperts(block, torch.bfloat16)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        ours, theirs = step(x), block(x)
        _, _, chosen = block.gate(x.view(32, 64))
    assert torch.equal(step.chosen, chosen)
    assert ours.dtype == theirs.dtype == torch.float32
    bound = 2**-6 * float(theirs.abs().max())
    torch.testing.assert_close(ours, theirs, atol=bound, rtol=0)


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
