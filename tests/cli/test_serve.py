"""``ardea serve MODEL_DIR`` through the real CLI: the real openai client talks to it, a
reward is attached over HTTP, and on SIGINT the recorded conversation is written as one
trajectory whose generated tokens and log-probs are those the client received."""

import json
import re
import signal
import subprocess
import sys

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow


def test_serve_records_a_conversation_and_writes_it_on_exit(tmp_path):
    from ardea.model import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer(model_max_length=512)
    build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                     intermediate_size=32).save_pretrained(tmp_path / "model")  # fmt: skip
    tokenizer.save_pretrained(tmp_path / "model")
    out = tmp_path / "recorded.jsonl"
    command = [sys.executable, "-m", "ardea.cli.main", "serve", str(tmp_path / "model"),
               "--port", "0", "--out", str(out), "--max-tokens", "6"]  # fmt: skip
    # Started with SIGINT ignored (a background job of a shell without job control runs the
    # suite so), the server would inherit that and install no KeyboardInterrupt handler:
    # a handled signal is reset to the default at exec, so it starts as from a terminal.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        line = proc.stdout.readline()
        url = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line).group(1)
        api = openai.OpenAI(base_url=url, api_key="-", max_retries=0)
        messages = [{"role": "user", "content": "guess 1-8"}]
        first = api.chat.completions.create(model="m", messages=messages, logprobs=True)
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": "higher"}]  # fmt: skip
        second = api.chat.completions.create(model="m", messages=messages, logprobs=True)
        assert httpx.post(
            f"{url}/rewards", json={"completion_id": second.id, "reward": 1.0}
        ).is_success
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "wrote 1 trajectories of 2 calls" in stdout
    (row,) = [json.loads(x) for x in out.read_text().splitlines()]
    generated = [s for s in row["segments"] if s["kind"] == "generated"]
    assert [s["turn"] for s in generated] == [0, 1] and row["reward"] == 1.0
    for segment, reply in zip(generated, (first, second)):
        sent = [t.logprob for t in reply.choices[0].logprobs.content]
        assert segment["logprobs"] == sent and len(segment["token_ids"]) == len(sent)
