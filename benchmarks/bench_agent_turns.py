"""Per-turn cost of a conversation through the recording client: what one turn costs besides
generation (checking the request, finding its parent, rendering the chat template,
tokenising what it adds, recording), at 2, 8 and 32 turns.

    python benchmarks/bench_agent_turns.py                        # this checkout
    python benchmarks/bench_agent_turns.py --baseline-src ../old/src   # side by side
    python benchmarks/bench_agent_turns.py --smoke                # seconds, no verdict

Workload: ``RecordingClient`` (default history policy) on the character tokenizer and the
tiny chat template, an engine that answers at once with a canned reply (so only the
client's own work is timed; no batching window), one conversation of ``T`` turns: user
message, reply, user message, ... Each turn's request carries the whole conversation, as
agent code sends it. Two kinds of reply: ``text`` (40 characters) and ``tool`` (a tool
call, which templates format their own way). Per turn: the mean over the conversation and
the last turn's time, best of ``--repeats`` runs; a run measures every case in one fresh
process after a warm-up conversation (``--baseline-src``: the same runs with that ``src``
directory's ardea, interleaved, and the ratio). The floor column is one rendering of the
last turn's whole conversation plus its tokenisation, timed alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TEXT = "I think the answer is forty-two, surely."
TOOL = '<tool_call>{"name": "lookup", "arguments": {"word": "heron"}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"word": {"type": "string"}}}}}]  # fmt: skip


def measure(turns: int, kind: str) -> dict[str, float]:
    """One conversation of ``turns`` turns in this process: per-turn seconds."""
    from ardea.agent import RecordingClient
    from ardea.model import build_char_tokenizer
    from ardea.rollout import Completion, GenerationEngine

    tokenizer = build_char_tokenizer(model_max_length=1_000_000)
    reply = tokenizer((TOOL if kind == "tool" else TEXT) + "<|im_end|>", add_special_tokens=False)
    reply_ids = list(reply["input_ids"])
    stops = tokenizer.convert_tokens_to_ids(["<eos>", "<|im_end|>"])

    class Canned(GenerationEngine):
        def generate(self, prompts, params):
            return [Completion(list(p), reply_ids, [-0.5] * len(reply_ids), "stop", 0)
                    for p in prompts]  # fmt: skip

        def update_weights(self, weights, version):
            raise NotImplementedError

        version = 0
        max_context = None
        stop_token_ids = stops

    client = RecordingClient(Canned(), tokenizer, max_tokens=64)
    messages = [{"role": "user", "content": "Let us begin: how long is the word heron?"}]
    times = []
    for turn in range(turns):
        start = time.perf_counter()
        out = client.chat.completions.create(messages=messages, tools=TOOLS)
        times.append(time.perf_counter() - start)
        message = out.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if message.get("tool_calls"):
            call_id = message["tool_calls"][0]["id"]
            messages.append({"role": "tool", "tool_call_id": call_id, "content": "5"})
        else:
            messages.append({"role": "user", "content": f"and turn {turn + 1}?"})
    start = time.perf_counter()
    text = tokenizer.apply_chat_template(messages[:-2], tools=TOOLS, tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip
    tokenizer(text, add_special_tokens=False)
    floor = time.perf_counter() - start
    return {"mean": sum(times) / len(times), "last": times[-1], "floor": floor}


def run(src: str | None, cases: list[tuple[int, str]]) -> list[dict[str, float]]:
    """``measure`` of each case in one fresh process, importing ardea from ``src`` (None:
    installed); a first throw-away conversation warms the template and the imports."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(Path(src).resolve())
    args = [sys.executable, __file__, "--worker", json.dumps(cases)]
    out = subprocess.run(args, capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline-src", help="another checkout's src directory")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        measure(2, "tool")  # warm-up, not reported
        print(json.dumps([measure(turns, kind) for turns, kind in json.loads(args.worker)]))
        return 0
    turn_counts, repeats = ([2, 4], 1) if args.smoke else ([2, 8, 32], args.repeats)
    sides = {"ardea": None} | ({"baseline": args.baseline_src} if args.baseline_src else {})
    cases = [(turns, kind) for kind in ("text", "tool") for turns in turn_counts]
    best: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeats):  # interleaved: both sides see the same machine state
        for side, src in sides.items():
            got = run(src, cases)
            old = best.get(side, got)
            best[side] = [{k: min(v, o[k]) for k, v in g.items()} for g, o in zip(got, old)]
    print("| reply | turns | side | per turn (mean) | last turn | floor (last turn) |")
    print("|---|---:|---|---:|---:|---:|")
    for i, (turns, kind) in enumerate(cases):
        for side in best:
            b = best[side][i]
            print(f"| {kind} | {turns} | {side} | {b['mean'] * 1e3:.2f} ms | "
                  f"{b['last'] * 1e3:.2f} ms | {b['floor'] * 1e3:.2f} ms |")  # fmt: skip
        if "baseline" in best:
            ratio = best["baseline"][i]["last"] / best["ardea"][i]["last"]
            print(f"| {kind} | {turns} | baseline / ardea (last turn) | | {ratio:.2f}× | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
