"""Helpers of the agent tests: a scripted engine, and log-probs recomputed independently."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ardea.rollout import Completion, GenerationEngine, SamplingParams


class FixedWeightsEngine(GenerationEngine):
    """An engine of the tests whose weights never change (version 0)."""

    def update_weights(self, named_tensors, version):
        raise NotImplementedError

    @property
    def version(self) -> int:
        return 0


class ScriptedEngine(FixedWeightsEngine):
    """Replies with the given texts in order (log-prob -0.5 each token), ending each with
    ``<|im_end|>``; records the prompts it was given and how many calls it served."""

    def __init__(self, tokenizer, replies):
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.prompts: list[list[int]] = []
        self.calls = 0
        # stops like the tiny model: <eos> and <|im_end|> (what the client reads)
        ends = tokenizer.convert_tokens_to_ids(["<eos>", "<|im_end|>"])
        self.model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=ends))

    def generate(self, prompts, params: SamplingParams):
        self.calls += 1
        out = []
        for p in prompts:
            self.prompts.append(list(p))
            ids = self.tokenizer(self.replies.pop(0) + "<|im_end|>", add_special_tokens=False)
            ids = ids["input_ids"]
            out.append(Completion(list(p), ids, [-0.5] * len(ids), "stop", self.version))
        return out


def recomputed_logprobs(model, input_ids: torch.Tensor) -> torch.Tensor:
    """``(N, S)`` token-aligned log π(x_t | x_<t) by one full forward of the plain HF model
    (column 0 is 0); independent of ardea's log-prob code."""
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits.float()  # (N, S, V)
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(lp, (1, 0))


class ForcedEngine(FixedWeightsEngine):
    """Replies with ``policy(prompt_text)`` + ``<|im_end|>``, with the behaviour log-probs the
    real ``model`` gives those tokens after that prompt (one forward of prompt + reply at
    temperature 1): a scripted agent whose log-probs are the model's own."""

    def __init__(self, model, tokenizer, policy):
        self._model = model
        self.tokenizer = tokenizer
        self.policy = policy
        self.calls = 0

    @property
    def model(self):
        return self._model

    def generate(self, prompts, params: SamplingParams):
        self.calls += 1
        out = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            reply = self.tokenizer(self.policy(text) + "<|im_end|>", add_special_tokens=False)
            ids = reply["input_ids"]
            full = torch.tensor([list(p) + ids])
            lp = recomputed_logprobs(self._model, full)[0, len(p) :].tolist()
            out.append(Completion(list(p), ids, lp, "stop", self.version))
        return out
