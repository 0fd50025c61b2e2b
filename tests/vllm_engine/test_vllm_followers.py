"""Two ranks on one vLLM server, as ``rollout.engine=vllm`` runs under torchrun: rank 0's
engine leads (it loads the weights), rank 1's follows (it sends its share of the requests),
talking over a real rendezvous store (``ardea.trainer.engine_peers.StorePeers``, the
``TCPStore`` torchrun starts). Here the two ranks are two engines of one process, each on a
thread as a rank's would be, on the session's real server; the torchrun runs themselves are
test_vllm_training.py's."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist
from vllm_testing import TOKENIZER, recomputed, tiny

from ardea.rollout import EngineSpec, SamplingParams, make_engine
from ardea.rollout.engines.vllm.server import VLLMServerError, free_port
from ardea.trainer.engine_peers import StorePeers

pytestmark = pytest.mark.slow  # the session's real vLLM server

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


@pytest.fixture
def store(monkeypatch):
    """A rendezvous store where torchrun's would be (its address in the environment)."""
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    yield master


def engines(url, model, tmp_path, ranks=2):
    """Rank 0's engine, then the others' (each waits for rank 0's servers)."""
    options = {"urls": [url], "timeout_s": 60.0, "sync_tolerance": 1e-4}
    built = []
    for rank in range(ranks):
        peers = StorePeers("live", 0, rank, ranks, timeout_s=60.0)
        spec = EngineSpec.of(model, TOKENIZER, options=options, work_dir=tmp_path / f"rank{rank}",
                             peers=peers)  # fmt: skip
        built.append(make_engine("vllm", spec, module=model))
    return built


def in_thread(call):
    """``call()`` on a thread of its own (a rank's); its result or error in a list."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(_attempt(call)))
    thread.start()
    return thread, box


def _attempt(call):
    try:
        return call()
    except Exception as error:  # handed to the test
        return error


def test_a_follower_samples_its_share_and_waits_for_rank_0s_weights(vllm_url, store, tmp_path):
    model = tiny(seed=0)
    leader, follower = engines(vllm_url, model, tmp_path)
    seeded = dict(temperature=1.0, max_new_tokens=6, seed=11, n=2)
    whole = leader.generate(PROMPTS, SamplingParams(**seeded))  # one process: every row
    # rank 0 prompt 0 (rows 0-1), rank 1 prompts 1-2 (rows 2-5), at the same time
    thread, mine = in_thread(
        lambda: leader.generate(PROMPTS[:1], SamplingParams(**seeded, row_ids=[0, 1]))
    )
    theirs = follower.generate(PROMPTS[1:], SamplingParams(**seeded, row_ids=[2, 3, 4, 5]))
    thread.join()
    split = mine[0] + theirs
    assert [c.token_ids for c in split] == [c.token_ids for c in whole]
    before = leader.metrics()["vllm/server0_requests"]

    trained = tiny(seed=1)  # the next version's weights, which rank 0 alone is given
    thread, loaded = in_thread(lambda: leader.update_weights(trained.state_dict(), 1))
    follower.update_weights({}, 1)  # returns once rank 0's load is done
    thread.join()
    assert loaded == [None] and follower.version == leader.version == 1
    # the follower's completions now come from the new weights, labelled version 1
    greedy = follower.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=6))
    own = recomputed(trained, PROMPTS[0], greedy[0].token_ids)
    assert torch.allclose(torch.tensor(greedy[0].logprobs, dtype=torch.float64), own, atol=1e-4)
    assert greedy[0].version == 1
    # rank 0 logs the job's requests: its own 2 + 3 rows, and the follower's 4 (sent with
    # its pause for version 1)
    assert before == 6 + 2 and leader.metrics()["vllm/server0_requests"] == 6 + 2 + 4
    for engine in (follower, leader):
        engine.close()


def test_a_failed_load_on_rank_0_fails_the_follower_naming_it(vllm_url, store, tmp_path):
    model = tiny(seed=0)
    leader, follower = engines(vllm_url, model, tmp_path)
    wrong = {"model.embed_tokens.weight": torch.zeros(3, 3)}  # not the policy's shape
    thread, loaded = in_thread(lambda: leader.update_weights(wrong, 1))
    with pytest.raises(VLLMServerError, match="rank 0 could not load version 1: "):
        follower.update_weights({}, 1)
    thread.join()
    assert isinstance(loaded[0], Exception)
    for engine in (follower, leader):
        engine.close()
