"""Counted FLOPs: a model's per-token sizes, training forwards and generations, by hand.

The model: Qwen2, hidden 8, one layer, 2 query heads of size 4 sharing 1 key-value head,
MLP 16, vocabulary 10. Its matrices per token: q 8·8 + k 8·4 + v 8·4 + o 8·8 + gate, up,
down 3·8·16 = 576 multiply-adds (M); the head 8·10 = 80; attention A = 1·2·4 = 8.
A forward of ``new`` tokens after ``past``: 2·576·new + 2·8·new·(2·past + new + 1) + 2·80·heads.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from ardea.model import sequence_logprobs
from ardea.model.flops import COUNTER, FlopCounter, ModelFlops, model_flops
from ardea.rollout.engine import Request, SamplingParams
from ardea.rollout.engines.inprocess.engine import InProcessEngine

NOTHING = dict.fromkeys(FlopCounter.KINDS, 0.0)  # a count with nothing added


def tiny(tied: bool = False) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        tie_word_embeddings=tied,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(config)


@pytest.mark.parametrize("tied", [False, True])
def test_model_sizes_by_hand(tied):
    model = tiny(tied)
    assert model_flops(model) == ModelFlops(matmul=576.0, head=80.0, attention=8.0)
    assert model_flops(model.model) == ModelFlops(matmul=576.0, head=0.0, attention=8.0)


def test_linear_flops_agree_with_torchs_flop_counter():
    """torch's own counter (every mm / addmm the forward runs) against 2·(M + H·V)·tokens."""
    model = tiny()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=ids)
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    linear = sum(n for op, n in by_op.items() if op.split(".")[1] in ("mm", "addmm"))
    assert linear == 2 * (576 + 80) * 5
    assert model_flops(model).forward(5) - 2 * 8 * 5 * 6 == linear  # the rest is attention


def test_training_forwards_count_real_tokens_three_times_with_autograd():
    model = tiny()
    ids = torch.tensor([[1, 2, 3], [4, 5, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # backbone over 3 + 2 tokens, head on the 2 + 1 scored positions
    by_hand = 2 * 576 * 5 + 2 * 8 * (3 * 4 + 2 * 3) + 2 * 80 * 3
    before = COUNTER.totals()
    with torch.no_grad():
        sequence_logprobs(model, ids, mask)
    # the products' rows: all 2 x 3 positions, padding included, once per pass
    once = {"train": by_hand, "decode": 0.0, "train_rows": 6.0, "train_passes": 1.0}
    assert COUNTER.since(before) == once
    before = COUNTER.totals()
    sequence_logprobs(model, ids, mask).logprobs.sum().backward()
    thrice = {"train": 3 * by_hand, "decode": 0.0, "train_rows": 18.0, "train_passes": 3.0}
    assert COUNTER.since(before) == thrice


def test_a_generation_counts_each_prompt_once_then_one_token_per_step():
    model = tiny()
    engine = InProcessEngine(model, pad_token_id=0, eos_token_ids=9)
    params = SamplingParams(temperature=1.0, max_new_tokens=4, min_new_tokens=4, n=2, seed=0)
    before = COUNTER.totals()
    completions = engine.generate([[1, 2, 3], [4, 5]], params)
    assert [len(c.token_ids) for c in completions] == [4, 4, 4, 4]
    prefill = (2 * 576 * 3 + 2 * 8 * 3 * 4 + 2 * 80) + (2 * 576 * 2 + 2 * 8 * 2 * 3 + 2 * 80)
    # three more tokens per row after 3 (or 2) prompt tokens: keys 4+5+6 (or 3+4+5)
    steps_3 = 2 * 576 * 3 + 4 * 8 * (4 + 5 + 6) + 2 * 80 * 3
    steps_2 = 2 * 576 * 3 + 4 * 8 * (3 + 4 + 5) + 2 * 80 * 3
    decode = prefill + 2 * steps_3 + 2 * steps_2
    assert COUNTER.since(before) == {**NOTHING, "decode": decode}


def test_requests_are_counted_as_a_batch_call_is():
    """Generation is counted where rows join and leave the engine's batch, so requests (an
    agent's calls) count as a batch call of the same rows does."""
    model = tiny()
    engine = InProcessEngine(model, pad_token_id=0, eos_token_ids=9)
    params = SamplingParams(temperature=1.0, max_new_tokens=4, min_new_tokens=4, seed=0)
    before = COUNTER.totals()
    handles = engine.submit_all([Request([1, 2, 3], params, 0), Request([4, 5], params, 1)])
    assert [len(c.token_ids) for c in engine.wait(handles)] == [4, 4]
    prefill = (2 * 576 * 3 + 2 * 8 * 3 * 4 + 2 * 80) + (2 * 576 * 2 + 2 * 8 * 2 * 3 + 2 * 80)
    steps_3 = 2 * 576 * 3 + 4 * 8 * (4 + 5 + 6) + 2 * 80 * 3
    steps_2 = 2 * 576 * 3 + 4 * 8 * (3 + 4 + 5) + 2 * 80 * 3
    assert COUNTER.since(before) == {**NOTHING, "decode": prefill + steps_3 + steps_2}


def test_counts_added_from_threads_all_arrive():
    import threading

    before = COUNTER.totals()
    threads = [
        threading.Thread(target=lambda: [COUNTER.add("decode", 1.0) for _ in range(1000)])
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    COUNTER.add("train", torch.tensor(2.5))
    assert COUNTER.since(before) == {**NOTHING, "train": 2.5, "decode": 4000.0}
