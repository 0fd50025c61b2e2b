"""How agents' calls enter the engine: choices as requests at their own rows, and the
lockstep rule (released together once every running episode has a call waiting and none
on its way; in episode, call-number order)."""

from __future__ import annotations

import pytest

from ardea.agent.calls import EngineRequest, choice_requests, submit_calls, wait_calls
from ardea.agent.lockstep import Lockstep
from ardea.rollout import SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=4, seed=9)


def test_choices_are_requests_at_rows_row_id_times_n_plus_k():
    with_row = choice_requests(EngineRequest([1, 2], PARAMS, n=3, row_id=2))
    without = choice_requests(EngineRequest([1, 2], PARAMS, n=2))
    assert [r.row_id for r in with_row] == [6, 7, 8] and [r.row_id for r in without] == [0, 1]
    assert all(r.params.n == 1 and r.params.seed == 9 for r in with_row + without)


def test_a_call_samples_the_rows_of_one_batch_call(engine, tokenizer):
    """Two choices at row 1 (rows 2 and 3) sample what a batch call's rows 2 and 3 do."""
    prompt = tokenizer("guess 1-8")["input_ids"]
    call = EngineRequest(prompt, PARAMS, n=2, row_id=1)
    submit_calls(engine, [call])
    wait_calls(engine, [call])
    batch = engine.generate([prompt, prompt], SamplingParams(**{**vars(PARAMS), "row_ids": [2, 3]}))
    assert [c.token_ids for c in call.completions] == [c.token_ids for c in batch]


def lockstep(episodes: int) -> Lockstep:
    step = Lockstep(seed=1, index=(0,), rows={e: e for e in range(episodes)},
                    groups={e: 0 for e in range(episodes)}, sampling=PARAMS, locked=False)  # fmt: skip
    for e in range(episodes):
        step.start(e)
    return step


def test_calls_are_released_when_every_running_episode_has_one_waiting(engine, tokenizer):
    step = lockstep(3)
    step.attach(engine)
    prompt = tokenizer("guess 1-8")["input_ids"]
    served = []
    calls = {}
    for e in (2, 0):
        calls[e] = EngineRequest(prompt, PARAMS)
        step.tag(calls[e], e, 0)
        step.arrive(calls[e], lambda e=e: served.append(e))
    assert step.releases == 0 and all(c.handles is None for c in calls.values())
    number = step.issue(1)  # episode 1's call is on its way: still no release
    step.lost(1, number)  # it will not arrive, but episode 1 runs on: none yet
    assert step.releases == 0
    step.finish(1)  # episode 1 ended: the others go
    assert step.releases == 1
    wait_calls(engine, list(calls.values()))
    assert sorted(served) == [0, 2] and [c.order for c in (calls[0], calls[2])] == [
        (1, 0, 0), (1, 2, 0),
    ]  # fmt: skip
    assert all(len(c.completions) == 1 for c in calls.values())


def test_closing_fails_waiting_calls_and_refuses_later_ones(engine):
    step = lockstep(2)
    step.attach(engine)
    call = EngineRequest([5, 6], PARAMS)
    step.tag(call, 0, 0)
    served = []
    step.arrive(call, lambda: served.append(call.error))
    step.close()
    assert len(served) == 1 and "closed" in str(served[0])
    with pytest.raises(RuntimeError, match="closed"):
        step.arrive(EngineRequest([5], PARAMS))
