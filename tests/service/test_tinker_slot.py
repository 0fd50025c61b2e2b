"""A shared engine's turns (``EngineSlot``), on a recording fake engine: requests for other
weights wait until the running ones are done, then the weights load (or, for another
layout, a new engine is built); an inflight publish loads at once; a forgotten key loads
again; requests keep the order they were sent in."""

import threading
import time

from ardea.rollout.engine import (
    Completion,
    GenerationEngine,
    Request,
    RequestHandle,
    SamplingParams,
)
from ardea.service.tinker_slot import EngineSlot, Load


class Recording(GenerationEngine):
    """Holds its requests open until a test finishes them; logs what happens to it."""

    def __init__(self, layout, weights, log):
        self.layout, self.weights, self.log, self.open = layout, weights, log, []
        log.append(("build", layout, weights))

    def generate(self, prompts, params):
        raise NotImplementedError

    def submit(self, request):
        handle = RequestHandle(request)
        self.open.append(handle)
        self.log.append(("submit", self.weights))
        return handle

    def update_weights(self, weights, version):
        self.log.append(("update", weights))
        self.weights, self._version = weights, version

    def close(self):
        self.log.append(("close", self.layout))


def load(name, layout, log):
    return lambda: Load(
        layout, lambda _layout: name, lambda: (Recording(layout, name, log), layout)
    )


def start(slot, key, loader):
    started = threading.Event()
    request = Request([1, 2], SamplingParams(max_new_tokens=2))
    slot.start(key, loader, [request], lambda handles: started.set(), lambda exc: print(exc))
    return started


def finish(engine):
    for handle in engine.open:
        handle.finish(Completion([1, 2], [3], [0.0], "length", 0))
    engine.open.clear()


def wait_for(condition):
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_turns_on_a_shared_engine():
    log, slot = [], EngineSlot()
    assert start(slot, "a", load("a", "L1", log)).wait(10)
    engine = slot.engine
    b = start(slot, "b", load("b", "L1", log))
    time.sleep(0.2)
    assert not b.is_set() and log == [("build", "L1", "a"), ("submit", "a")]  # a still runs
    finish(engine)
    assert b.wait(10) and log[2:] == [("update", "b"), ("submit", "b")]
    finish(engine)
    assert start(slot, "c", load("c", "L2", log)).wait(10)  # another layout: a new engine
    assert log[4:] == [("close", "L1"), ("build", "L2", "c"), ("submit", "c")]
    slot.publish("c", load("c2", "L2", log))  # running requests do not hold a publish back
    wait_for(lambda: len(log) == 8)
    assert log[7] == ("update", "c2") and slot.key == "c"
    slot.publish("a", load("a2", "L1", log))  # not the engine's weights: nothing to load
    slot.forget("c")
    wait_for(lambda: slot.key is None)
    finish(slot.engine)
    assert start(slot, "c", load("c3", "L2", log)).wait(10)
    assert log[8:] == [("update", "c3"), ("submit", "c3")]
    slot.close()
    assert log[-1] == ("close", "L2") and slot.engine is None
