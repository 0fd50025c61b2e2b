"""In-order execution and retries of the Tinker server's training requests."""

import threading

import pytest

from ardea.service.tinker_futures import Futures, Worker


def test_requests_run_in_seq_order_once_each_and_failures_stay_local():
    worker = Worker(Futures())
    worker.start_model("m")
    ran, gate = [], threading.Event()

    def op(seq, fail=False):
        def run():
            gate.wait(5)
            ran.append(seq)
            if fail:
                raise ValueError(f"request {seq} failed")
            return seq

        return run

    third = worker.run_in_order("m", 3, op(3))
    second = worker.run_in_order("m", 2, op(2, fail=True))
    assert ran == []  # 2 and 3 wait for 1
    first = worker.run_in_order("m", 1, op(1))
    assert worker.run_in_order("m", 3, op("retry")) == third  # a retry: same id, not rerun
    gate.set()
    assert worker.futures.get(third).result(5) == 3
    assert worker.futures.get(first).result(5) == 1
    with pytest.raises(ValueError, match="request 2 failed"):
        worker.futures.get(second).result(5)
    assert ran == [1, 2, 3]
    worker.close()


def test_settled_results_are_dropped_after_their_keeping_time(monkeypatch):
    import ardea.service.tinker_futures as module

    futures = Futures()
    kept, future = futures.new()
    future.set_result("done")
    assert futures.get(kept).result() == "done"
    monkeypatch.setattr(module, "KEEP_SECONDS", 0.0)
    pending, _ = futures.new()  # a new request drops what settled before it
    assert futures.get(kept) is None
    assert futures.get(pending) is not None  # unsettled ones stay
