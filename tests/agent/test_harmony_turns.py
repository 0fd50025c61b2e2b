"""gpt-oss's chat format (harmony) through the recording client: channels in the reply, a
final answer the model stops at ``<|return|>`` (a tool call at ``<|call|>``) while the template
closes every earlier assistant turn with ``<|end|>``, and earlier reasoning (the ``analysis``
channel) dropped from later renderings. Under ``history="error"`` the rewrite is named;
under ``keep_tokens`` the conversation is one token-faithful row whose stopped turns end at
the token the model generated, not at that token followed by the template's ``<|end|>``.

The template is written here from the format's documented behaviour (roles as
``<|start|>{role}<|message|>…<|end|>``, an assistant turn as
``<|start|>assistant<|channel|>{channel}<|message|>…``, the generation prompt
``<|start|>assistant``); the model's raw channel text is the reply's content, as ardea parses
no channels."""

from __future__ import annotations

import copy

import pytest

from ardea.agent import HistoryRewriteError, RecordingClient
from ardea.data import TrajectoryBatch
from ardea.rollout import Completion

from .agent_testing import FixedWeightsEngine

SPECIAL = ["<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>", "<|call|>"]
# earlier assistant turns keep their final channel only; the last one as the model wrote it
HARMONY = (
    "{% for m in messages %}{% set c = m['content'] or '' %}"
    "{% if m['role'] == 'assistant' %}"
    "{% if not loop.last and '<|channel|>final<|message|>' in c %}"
    "{% set c = '<|channel|>final<|message|>' + c.split('<|channel|>final<|message|>')[-1] %}"
    "{% endif %}{{ '<|start|>assistant' + c + '<|end|>' }}"
    "{% else %}{{ '<|start|>' + m['role'] + '<|message|>' + c + '<|end|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}"
)
THOUGHT = "<|channel|>analysis<|message|>think<|end|><|start|>assistant"
REPLIES = [THOUGHT + "<|channel|>final<|message|>4", "<|channel|>final<|message|>6"]


class HarmonyEngine(FixedWeightsEngine):
    """Replies with the given texts in order, each ended by ``<|return|>`` (or cut at the
    length limit without it); records the prompts it was given and its outputs."""

    def __init__(self, tokenizer, replies, cut=()):
        self.tokenizer, self.replies, self.cut = tokenizer, list(replies), set(cut)
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []
        self.stops = tokenizer.convert_tokens_to_ids(["<|return|>", "<|call|>"])

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            cut = len(self.outputs) in self.cut
            text = self.replies.pop(0) + ("" if cut else "<|return|>")
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self.prompts.append(list(p))
            self.outputs.append(list(ids))
            out.append(Completion(list(p), ids, [-0.5] * len(ids), "length" if cut else "stop", 0))
        return out


@pytest.fixture
def harmony(tokenizer):
    out = copy.deepcopy(tokenizer)
    out.add_special_tokens({"additional_special_tokens": SPECIAL})
    out.chat_template = HARMONY
    return out


def two_turns(client):
    messages = [{"role": "user", "content": "guess 1-8"}]
    first = client.chat.completions.create(messages=messages)
    messages += [first.choices[0].message.model_dump(), {"role": "user", "content": "higher"}]
    return client.chat.completions.create(messages=messages)


def test_the_dropped_analysis_channel_is_named_under_history_error(harmony):
    client = RecordingClient(HarmonyEngine(harmony, REPLIES), harmony, history="error")
    with pytest.raises(HistoryRewriteError, match="keep_tokens"):
        two_turns(client)


@pytest.mark.parametrize("cut", [False, True], ids=["stopped", "cut-at-length"])
def test_keep_tokens_exports_one_token_faithful_row(harmony, cut):
    engine = HarmonyEngine(harmony, REPLIES, cut={0} if cut else ())
    client = RecordingClient(engine, harmony, history="keep_tokens")
    second = two_turns(client)
    client.set_reward(second.id, 1.0)
    (row,) = client.export()
    b = TrajectoryBatch.from_trajectories([row], pad_token_id=0)
    ids = b.input_ids[0][b.attention_mask[0].bool()].tolist()
    assert b.input_ids[0][b.loss_mask[0]].tolist() == sum(engine.outputs, [])
    assert engine.prompts[1] == ids[: len(engine.prompts[1])]  # the engine saw what is trained
    end = "" if not cut else "<|end|>"  # a stopped turn ends at <|return|>, a cut one is closed
    assert harmony.decode(ids) == (
        "<|start|>user<|message|>guess 1-8<|end|><|start|>assistant"
        + REPLIES[0] + ("<|return|>" if not cut else "") + end
        + "<|start|>user<|message|>higher<|end|><|start|>assistant"
        + REPLIES[1] + "<|return|>"
    )  # fmt: skip


@pytest.mark.parametrize("cut", [False, True], ids=["stopped", "cut-at-length"])
def test_new_trajectory_closes_a_turn_as_keep_tokens_does(harmony, cut):
    """Without reasoning to drop the template keeps history; the next call then continues
    the row after the reply's last token as keep_tokens does: after a generated
    ``<|return|>`` with the new messages alone, after a cut reply with the template's
    ``<|end|>`` first."""
    plain = ["<|channel|>final<|message|>4", "<|channel|>final<|message|>6"]
    rows = []
    for history in ("new_trajectory", "keep_tokens"):
        engine = HarmonyEngine(harmony, plain, cut={0} if cut else ())
        client = RecordingClient(engine, harmony, history=history)
        two_turns(client)
        rows.append(engine.prompts[1])
    assert rows[0] == rows[1]
    end = "<|end|>" if cut else "<|return|>"
    assert harmony.decode(rows[0]).endswith(f"4{end}<|start|>user<|message|>higher<|end|>"
                                            "<|start|>assistant")  # fmt: skip
