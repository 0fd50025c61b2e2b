"""At most ``max_streams`` requests stream at once on the vLLM engine; later ones wait in
order, start as streams end, and abort at once while waiting. The segments here are a
stand-in that holds until released: a server slow enough to hold 1,024 streams (the cap per
server) cannot be provoked on a CPU test machine, so the cap is checked at 2 on the real
StreamedRequests."""

from __future__ import annotations

import threading
import time

import ardea.rollout.engines.vllm.requests as vllm_requests
from ardea.rollout import Request, SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=4)


def test_streams_beyond_the_cap_wait_in_order_and_abort_at_once(monkeypatch):
    monkeypatch.setattr(vllm_requests, "MAX_STREAMS_PER_SERVER", 2)
    release, lock = threading.Event(), threading.Lock()
    started, live, peak = [], [0], [0]

    def segment(run, version):
        with lock:
            started.append(run.request.row_id)
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        release.wait(30)
        run.extend([run.request.row_id], [-0.5], version)
        with lock:
            live[0] -= 1
        return "length"

    requests = vllm_requests.StreamedRequests(segment, lambda: 0, servers=1)
    handles = [requests.submit(Request([1, 2], PARAMS, row), None) for row in range(5)]
    (aborted,) = requests.abort([handles[3]])  # waiting: done at once, no tokens
    assert aborted.finish_reason == "abort" and aborted.token_ids == []
    deadline = time.monotonic() + 30
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # room for a third stream to start, if the cap let one
    assert sorted(started) == [0, 1]  # two streams; the rest wait
    release.set()
    done = [h.result(timeout=30) for h in handles]
    assert [c.token_ids for c in done] == [[0], [1], [2], [], [4]]
    assert started[2:] == [2, 4] and peak[0] == 2
