"""An agent rollout split over processes plays the episodes one process would: each
episode samples with its own row of every turn's random numbers (its global row id), not
with its place among the episodes still playing."""

from ardea.agent.episodes import EpisodeRunner
from ardea.config import AgentConfig
from ardea.rollout import SamplingParams

ROWS = [{"turns": t} for t in (3, 1, 2, 3, 1, 2)]


def turns_runner(engine, tokenizer):
    """G = 2 episodes per row of an environment whose rows say how many turns they last."""
    return EpisodeRunner(
        engine,
        tokenizer,
        AgentConfig(env="tests.agent.agent_testing.TurnsEnv", max_turns=3),
        group_size=2,
        params=SamplingParams(temperature=1.0, max_new_tokens=5),
    )


def played_tokens(runner, rows, first_prompt):
    """Each episode's generated token ids, turn by turn, in episode order."""
    played = runner.generate(rows, seed_index=7, first_prompt=first_prompt)
    return [
        [tuple(call.output_ids) for call in episode.conversation.calls]
        for episode in played.episodes
    ]


def test_a_split_rollout_samples_what_one_process_would(engine, tokenizer):
    runner = turns_runner(engine, tokenizer)
    whole = played_tokens(runner, ROWS, 0)
    assert [len(calls) for calls in whole] == [3, 3, 1, 1, 2, 2, 3, 3, 1, 1, 2, 2]
    split = played_tokens(runner, ROWS[:1], 0) + played_tokens(runner, ROWS[1:4], 1)
    split += played_tokens(runner, ROWS[4:], 4)
    assert split == whole
    # and the samples differ between episodes (the ids are not all one stream)
    assert len({calls[0] for calls in whole}) > 1


def trained_rows(rollout):
    """The rollout's rows as (group, tokens, reward), in a fixed order."""
    batch = rollout.batch
    return sorted(
        (int(g), tuple(ids[m].tolist()), float(r))
        for g, ids, m, r in zip(batch.group_ids, batch.input_ids, batch.attention_mask.bool(), batch.rewards)
    )  # fmt: skip


def test_shares_played_apart_join_into_the_whole_rollout(engine, tokenizer):
    """The ranks' shares, sent in their checkpoint form and joined, collate into the rows one
    process plays: the same groups (numbered in the whole rollout), tokens and returns."""
    runner = turns_runner(engine, tokenizer)
    whole = runner.score(runner.generate(ROWS, seed_index=7))
    first = runner.generate(ROWS[:2], seed_index=7)
    rest = runner.generate(ROWS[2:], seed_index=7, first_prompt=2)
    sent = runner.restore_generation(runner.generation_state(rest), ROWS[2:])
    joined = runner.score(runner.join([first, sent]))
    assert sorted({g for g, _, _ in trained_rows(whole)}) == list(range(len(ROWS)))
    assert trained_rows(joined) == trained_rows(whole)
    same = {k: v for k, v in whole.metrics.items() if not k.startswith("perf/")}
    assert {k: joined.metrics[k] for k in same} == same
