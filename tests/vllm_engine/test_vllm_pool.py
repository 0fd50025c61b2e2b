"""A pool of two real vLLM servers (the session's and one of this module's, both logging
every request's prompt token ids):

- a multi-turn agent run keeps every call of an episode on one server, read from the
  servers' own logs (each turn's prompt extends the episode's previous prompt, so the
  previous turn is the longest logged prompt it extends), and uses both servers;
- online GRPO spreads over both; with the second server killed before step 2 the run
  finishes, the killed server's requests run on the other with the same seeds, and the run
  samples what the run without the kill sampled (the same completions and rollout metrics);
- a server that is not vLLM, and two servers with different context lengths, are refused
  before training, naming them.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import threading

import pytest
from vllm_testing import SIZE_OVERRIDES, logged_prompts, start_server

from ardea.config import load_config
from ardea.rollout.engines.vllm.server import VLLMServerError
from ardea.trainer import Trainer

pytestmark = pytest.mark.slow

RUN = [
    *SIZE_OVERRIDES,
    "model.compute_dtype=float32",
    "rollout.engine=vllm",
    "rollout.vllm.timeout_s=60",
    "rollout.group_size=4",
    "trainer.batch_size=4",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "data.eval_size=4",
    "logging.log_every=1",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.report=false",  # no report.png: half a second a run
]
GRPO = [
    "algo.name=online_grpo",
    'reward.functions=[{name: format_regex, kwargs: {pattern: "[0-4]"}}]',
    "rollout.max_new_tokens=6",
    "trainer.max_steps=3",
]
AGENT = [
    "algo.name=online_grpo",
    "data.task=null",
    "agent.env=guess_number",
    "agent.max_turns=3",
    "rollout.max_new_tokens=3",
    "trainer.max_steps=2",
]


@pytest.fixture(scope="module")
def second_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("vllm_second"))
    yield server
    server.stop()


def train(run_dir, urls, *overrides, during=None):
    """A run on the pool of ``urls``; ``during(trainer)`` first, when given."""
    pool = f"rollout.vllm.urls=[{', '.join(urls)}]"
    config = load_config(None, [*RUN, pool, f"trainer.output_dir={run_dir}", *overrides])
    trainer = Trainer(config)
    if during is not None:
        during(trainer)
    return trainer.train()


def steps(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train/loss" in r]


def test_every_call_of_an_episode_goes_to_one_server(vllm_server, second_server, tmp_path):
    servers = [vllm_server, second_server]
    starts = [s.log_path.stat().st_size for s in servers]
    train(tmp_path, [s.url for s in servers], *AGENT)
    served: dict[tuple[int, ...], set[int]] = {}
    for index, (server, start) in enumerate(zip(servers, starts)):
        prompts = logged_prompts(server, start)
        assert prompts, f"server {index} served none of the run's requests"
        for prompt in prompts:
            served.setdefault(prompt, set()).add(index)
    tight = 0
    for prompt, on in served.items():
        earlier = [p for p in served if len(p) < len(prompt) and prompt[: len(p)] == p]
        if not earlier:
            continue  # a first turn (or the weight-sync probe)
        previous = max(earlier, key=len)  # the episode's previous turn
        assert on <= served[previous], (prompt, on, served[previous])
        tight += len(served[previous]) == 1  # a previous turn only one server saw
    assert tight > 0  # third turns extend second turns, which are unique to their episode


def test_a_killed_server_loses_nothing(vllm_server, second_server, tmp_path):
    """Runs on the pool with and without killing this module's server before step 2. It is
    first in the pool: a call's first request goes to the server with the fewest in flight,
    the lowest index on a tie, so step 2's first request is sent to the killed server and
    has to run again on the other (a server no request reached would only be found out at
    the next weight reload). The runs sample the same tokens: the same seeds on the same
    weights; the servers batch the requests differently, which moves a logit by float32
    rounding, so a token could flip only where its uniform draw lies within ~1e-7 of a
    boundary of the sampling distribution."""
    urls = [second_server.url, vllm_server.url]
    whole = train(tmp_path / "whole", urls, *GRPO)
    used = steps(tmp_path / "whole")[-1]
    assert used["vllm/server0_requests"] > 0 and used["vllm/server1_requests"] > 0

    def kill_before_step_2(trainer):
        generate, calls = trainer.service.runner.generate, []

        def generating(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                os.killpg(second_server.process.pid, signal.SIGKILL)
                second_server.process.wait(timeout=30)
            return generate(*args, **kwargs)

        trainer.service.runner.generate = generating

    killed = train(tmp_path / "killed", urls, *GRPO, during=kill_before_step_2)
    assert killed["steps"] == whole["steps"] == 3
    after = steps(tmp_path / "killed")
    assert after[-1]["vllm/server0_up"] == 0 and after[-1]["vllm/retried_requests"] >= 1
    for a, b in zip(steps(tmp_path / "whole"), after, strict=True):
        for key in ("rollout/reward_mean", "rollout/reward_std", "rollout/response_length"):
            assert a[key] == b[key], (a["step"], key)
    samples = [
        [json.loads(line)["completion"] for line in (tmp_path / run / "samples.jsonl").open()]
        for run in ("whole", "killed")
    ]
    assert samples[0] == samples[1]


def test_what_is_not_a_pool_is_refused(vllm_server, tmp_path):
    """A web server that is not vLLM, and a server with another context length."""
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{web.server_address[1]}"
    try:
        with pytest.raises(VLLMServerError, match=f"{url} answered the logprobs-mode check"):
            train(tmp_path / "web", [vllm_server.url, url], *GRPO)
    finally:
        web.shutdown()
    shorter = start_server(tmp_path / "shorter", max_model_len=128)
    try:
        with pytest.raises(VLLMServerError, match=rf"different context lengths \({vllm_server.url}: 256, {shorter.url}: 128"):  # fmt: skip
            train(tmp_path / "lengths", [vllm_server.url, shorter.url], *GRPO)
    finally:
        shorter.stop()
