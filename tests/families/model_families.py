"""The decoder families of the support matrix: a tiny random model of each, built from
transformers' own config class, saved with ``save_pretrained`` beside ardea's character
tokenizer, as a user's checkpoint is (no ardea code builds them).

Every model: hidden 64, 2 layers, 2 heads (1 key/value head, head dim 32: the smallest vLLM's
CPU attention takes), float32.
Sliding-window families get a window of 8 tokens, shorter than a row, so the window binds;
MoE families 4 experts, 2 per token; hybrid ones one linear-attention or convolution layer
and one full-attention layer.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from ardea.model import build_char_tokenizer

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, max_position_embeddings=256)  # fmt: skip
MOE = dict(num_experts_per_tok=2)
LINEAR = dict(linear_num_value_heads=2, linear_num_key_heads=1, linear_key_head_dim=32,
              linear_value_head_dim=32, layer_types=["linear_attention", "full_attention"])  # fmt: skip
SLIDING = dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"])

#: family -> (transformers config class, model class, config keyword arguments, what it is)
FAMILIES: dict[str, tuple[str, str, dict, str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, "dense"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}, "dense, q/k norms"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", SLIDING | dict(tie_word_embeddings=True),
               "dense, sliding window, tied embeddings"),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", SLIDING, "dense, sliding window"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  MOE | dict(num_experts=4, moe_intermediate_size=32, norm_topk_prob=True), "MoE"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", MOE | dict(num_local_experts=4), "MoE"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", MOE | SLIDING | dict(num_local_experts=4),
                "MoE, sliding window, attention sinks"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", MOE | dict(
        n_routed_experts=4, moe_intermediate_size=32, first_k_dense_replace=1, n_group=2,
        topk_group=1, n_shared_experts=1, kv_lora_rank=32, q_lora_rank=None, head_dim=32,
        qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32, num_key_value_heads=2,
        topk_method="noaux_tc"),
        "MLA, MoE with grouped routing, a dense first layer"),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", MOE | dict(
        n_routed_experts=4, moe_intermediate_size=32, first_k_dense_replace=0, n_group=1,
        topk_group=1, n_shared_experts=1), "MoE, shared expert"),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", MOE | LINEAR | dict(
        num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32),
        "hybrid gated delta net, MoE"),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", LINEAR, "hybrid gated delta net"),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(layer_types=["conv", "full_attention"]),
             "hybrid short convolution"),
}  # fmt: skip


#: the attention projections LoRA adapts (MLA has no v_proj: its values come from kv_b_proj)
LORA_TARGETS = {"deepseek_v3": ["q_proj", "kv_b_proj"]}


def lora_targets(family: str) -> list[str]:
    return LORA_TARGETS.get(family, ["q_proj", "v_proj"])


def save_family(family: str, directory: Path, seed: int = 0) -> Path:
    """``directory`` holding the family's tiny random model and the character tokenizer."""
    config_class, model_class, extra, _ = FAMILIES[family]
    tokenizer = build_char_tokenizer(model_max_length=256)
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
               eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)  # fmt: skip
    config = getattr(transformers, config_class)(**(BASE | ids | extra))
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


#: the matrix's columns: a short run (matrix_cells.py) or check each, and its heading
COLUMNS = {
    "sft": "SFT",
    "dpo": "DPO",
    "grpo": "online GRPO",
    "ppo": "online PPO",
    "lora": "LoRA",
    "replay": "routing replay",
    "engine": "continuous batching",
    "torchrun": "torchrun (DDP)",
    "vllm": "vLLM (CPU)",
}
#: (family, column) -> the refusal that cell is: its words on the page and the words ardea's
#: error names it with (all other cells: ✓)
REFUSALS: dict[tuple[str, str], tuple[str, str]] = {
    **{(f, "replay"): ("refused: dense, nothing to replay", "needs a mixture-of-experts policy")
       for f, (*_, what) in FAMILIES.items() if "MoE" not in what},
    **{(f, "vllm"): ("refused at the first weight sync: the CPU build reloads MoE experts "
                     "wrongly", "reloads an MoE layer's expert weights wrongly")
       for f, (*_, what) in FAMILIES.items() if "MoE" in what and "MLA" not in what},
    ("deepseek_v3", "vllm"): ("fails at server start: the CPU build's MLA takes bfloat16 or "
                              "float16 weights, not float32", "expect weight to be bfloat16"),
    ("qwen3_next", "vllm"): ("fails at its first generation: the CPU build's gated delta net "
                             "needs bfloat16", "CPU GDN attention requires BF16"),
    ("qwen3_5", "vllm"): ("fails at server start: vLLM loads it as a vision-language model, "
                          "which needs torchvision", "torchvision"),
    ("lfm2", "vllm"): ("fails at server start: vLLM reads `conv_dim`, which transformers 5.25 "
                       "no longer writes", "conv_dim"),
}  # fmt: skip
#: the vLLM column is not in the suite (a server start per family, about 18 s each): it was
#: measured with check_vllm_families.py on this date and machine; the suite checks one MoE
#: family's refusal (tests/vllm_engine/test_vllm_families.py)
VLLM_CHECKED = "2026-12-07, vLLM 0.32 CPU build on a 2-vCPU Intel Xeon with AMX"


def expected(family: str, column: str) -> tuple[str, str] | None:
    """None where the cell trains (✓), else the refusal it is (page words, error words)."""
    return REFUSALS.get((family, column))


def support_matrix_markdown() -> str:
    """docs/reference/models.md: the matrix as the tests check it."""
    head = "| family | transformers class | what | " + " | ".join(COLUMNS.values()) + " |"
    rows = [head, "|" + "---|" * (len(COLUMNS) + 3)]
    for family, (_, model_class, _, what) in FAMILIES.items():
        cells = [(expected(family, column) or ("✓",))[0] for column in COLUMNS]
        rows.append(f"| {family} | `{model_class}` | {what} | " + " | ".join(cells) + " |")
    rows.append("")
    rows.append(f"The vLLM column: measured by check_vllm_families.py ({VLLM_CHECKED}).")
    return "\n".join(rows) + "\n"
