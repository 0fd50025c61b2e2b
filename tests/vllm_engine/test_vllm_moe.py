"""An MoE model on a launched vLLM server (the CPU build): the server starts from the
per-expert tensors ``save_pretrained`` writes (transformers fuses a layer's experts into one
tensor in memory, which vLLM's Mixtral loader does not know: it refused to start on them)
and greedy-decodes what transformers decodes; a weight sync is then refused, naming why:
vLLM 0.32's CPU build reloads expert weights wrongly in place, and ardea's sync probe sees
its completion leave transformers' (docs/reference/models.md). One server start, ~18 s."""

from __future__ import annotations

import pytest
import torch
import transformers
from vllm_testing import PYTHON, TOKENIZER, hf_greedy

from ardea.rollout import EngineSpec, SamplingParams, make_engine
from ardea.rollout.engines.vllm.server import VLLMServerError

pytestmark = pytest.mark.slow


def test_an_moe_model_starts_from_its_checkpoint_layout_and_a_bad_reload_is_refused(tmp_path):
    config = transformers.MixtralConfig(
        vocab_size=len(TOKENIZER), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=256, pad_token_id=TOKENIZER.pad_token_id,
        eos_token_id=TOKENIZER.eos_token_id, bos_token_id=TOKENIZER.bos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    options = {"launch": True, "python": str(PYTHON), "timeout_s": 60.0, "max_model_len": 256}
    spec = EngineSpec.of(model, TOKENIZER, options=options, work_dir=tmp_path)
    engine = make_engine("vllm", spec, module=model)
    try:
        prompt = TOKENIZER("12+34=")["input_ids"]
        (out,) = engine.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=8))
        with torch.no_grad():
            assert out.token_ids == hf_greedy(model, prompt, 8, [TOKENIZER.eos_token_id])
            for name, tensor in model.named_parameters():
                tensor.mul_(1.5 if "experts" in name else 1.0)
        with pytest.raises(VLLMServerError, match="reloads an MoE layer's expert weights wrongly"):
            engine.update_weights(model.state_dict(), 1)
    finally:
        engine.close()
