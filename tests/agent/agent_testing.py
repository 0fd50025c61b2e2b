"""Helpers of the agent tests: a scripted engine, and log-probs recomputed independently."""

from __future__ import annotations

import os

import torch

from ardea.agent.env import Environment, StepResult
from ardea.agent.tools import ToolBox
from ardea.rollout import Completion, EngineSpec, GenerationEngine, SamplingParams, load_weights


class FixedWeightsEngine(GenerationEngine):
    """An engine of the tests whose weights never change (version 0), without a context
    limit, stopping at ``self.stops``."""

    stops: list[int] = []

    def update_weights(self, weights, version):
        raise NotImplementedError

    @property
    def version(self) -> int:
        return 0

    @property
    def max_context(self) -> int | None:
        return None

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self.stops)


class ScriptedEngine(FixedWeightsEngine):
    """Replies with the given texts in order (log-prob -0.5 each token), ending each with
    ``<|im_end|>``; records the prompts it was given and how many calls it served."""

    def __init__(self, tokenizer, replies):
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []  # the token ids of each reply, as generated
        self.calls = 0
        # stops like the tiny model: <eos> and <|im_end|> (what the client reads)
        self.stops = tokenizer.convert_tokens_to_ids(["<eos>", "<|im_end|>"])

    def generate(self, prompts, params: SamplingParams):
        self.calls += 1
        out = []
        for p in prompts:
            self.prompts.append(list(p))
            ids = self.tokenizer(self.replies.pop(0) + "<|im_end|>", add_special_tokens=False)
            ids = ids["input_ids"]
            self.outputs.append(list(ids))
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
        self.stops = tokenizer.convert_tokens_to_ids(["<eos>", "<|im_end|>"])

    @property
    def max_context(self) -> int | None:
        return self._model.config.max_position_embeddings

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


class TurnsEnv(Environment):
    """An environment of the tests whose episode lasts ``row["turns"]`` replies, whatever
    the model says (episodes of one call end at different turns)."""

    @classmethod
    def rows(cls, count, seed, *, split, **_):
        return [{"turns": 1 + i % 3} for i in range(count)]

    def reset(self, row):
        self.left = int(row["turns"])
        return [{"role": "user", "content": "say something"}]

    def step(self, reply):
        self.left -= 1
        return StepResult([{"role": "user", "content": "again"}], 0.0, self.left == 0, {})


class InterfaceEngine(GenerationEngine):
    """An engine written only against the documented interface, the way one driving a
    remote server is: built from an :class:`EngineSpec` alone (no module, no ``.model``), it
    answers ``"7"`` on rows with an even row id and ``"x"`` on odd ones, then a stop token,
    with log-prob -0.5 per token. It records each ``update_weights`` (version, number of
    tensors) and whether it was closed; ``INSTANCES`` holds every one built."""

    INSTANCES: list[InterfaceEngine] = []

    def __init__(self, spec: EngineSpec, version: int = 0) -> None:
        self.spec = spec
        self._version = version
        self.updates: list[tuple[int, int]] = []
        self.closed = False
        self.rows_seen: list[int] = []
        InterfaceEngine.INSTANCES.append(self)

    def generate(self, prompts, params: SamplingParams):
        rows = params.rows(len(prompts) * params.n)
        self.rows_seen += rows
        stop = self.spec.stop_token_ids[-1]
        out = []
        for i, row in enumerate(rows):
            text = "7" if row % 2 == 0 else "x"
            ids = self.spec.tokenizer(text, add_special_tokens=False)["input_ids"] + [stop]
            prompt = list(prompts[i // params.n])
            out.append(Completion(prompt, ids, [-0.5] * len(ids), "stop", self._version))
        return out

    def update_weights(self, weights, version):
        if version <= self._version:
            raise ValueError(f"version must increase: {version} after {self._version}")
        self.updates.append((version, len(load_weights(weights))))
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int | None:
        return self.spec.model_config.max_position_embeddings

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self.spec.stop_token_ids)

    def close(self) -> None:
        self.closed = True


def interface_engine(spec: EngineSpec, *, module=None, version: int = 0) -> InterfaceEngine:
    """``rollout.engine=tests.agent.agent_testing.interface_engine``: ignores the live
    module, as an engine on another machine must."""
    return InterfaceEngine(spec, version)


class UpdatingEnv(TurnsEnv):
    """:class:`TurnsEnv` that calls ``UPDATE()`` (set by a test) after the first reply of an
    episode: a weight update landing between two turns of one episode."""

    UPDATE = None

    def step(self, reply):
        if self.left == int(self.row_turns) and UpdatingEnv.UPDATE is not None:
            UpdatingEnv.UPDATE()
        return super().step(reply)

    def reset(self, row):
        self.row_turns = int(row["turns"])
        return super().reset(row)


class CrashingEnv(TurnsEnv):
    """A TurnsEnv whose ``reset`` raises for rows with ``crash: "reset"`` and whose second
    ``step`` raises for rows with ``crash: "step"`` (a sandbox that went down)."""

    def reset(self, row):
        self.crash = row.get("crash")
        if self.crash == "reset":
            raise ConnectionError("sandbox unreachable")
        self.steps = 0
        return super().reset(row)

    def step(self, reply):
        self.steps += 1
        if self.crash == "step" and self.steps == 2:
            raise RuntimeError("sandbox died")
        return super().step(reply)


class FlakyEnv(CrashingEnv):
    """A CrashingEnv that crashes once per ``flaky`` key of its rows (the first episode to
    get there), then never again: a transient failure (``FlakyEnv.crashed`` holds the keys;
    a test clears it)."""

    crashed: set = set()

    def reset(self, row):
        flaky = row.get("flaky")
        if flaky is not None and flaky in FlakyEnv.crashed:
            row = {k: v for k, v in row.items() if k != "crash"}
        elif flaky is not None:
            FlakyEnv.crashed.add(flaky)
        return super().reset(row)


def _exits(x: int) -> str:
    os._exit(3)


def _double(x: int) -> str:
    return str(2 * x)


class SandboxEnv(Environment):
    """One question; tools ``double`` and ``exit`` (whose sandbox process dies); a reply
    without a tool call ends the episode with reward 1."""

    def __init__(self, *, max_turns: int = 4) -> None:
        super().__init__(max_turns=max_turns)
        self.toolbox = ToolBox({"double": _double, "exit": _exits}, timeout=60.0)

    @classmethod
    def rows(cls, count, seed, *, split, **_):
        return [{"question": f"q{i}"} for i in range(count)]

    def reset(self, row):
        return [{"role": "user", "content": row["question"]}]

    def step(self, reply):
        tools = self.run_tools(reply)
        return tools if tools is not None else StepResult([], 1.0, True, {"success": True})
