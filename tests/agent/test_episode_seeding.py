"""An agent rollout split over processes plays the episodes one process would: each
episode samples with its own row of every turn's random numbers (its global row id), not
with its place among the episodes still playing."""

from ardea.agent.episodes import EpisodeRunner
from ardea.config import AgentConfig
from ardea.rollout import SamplingParams

ROWS = [{"turns": t} for t in (3, 1, 2, 3, 1, 2)]


def played_tokens(runner, rows, first_prompt):
    """Each episode's generated token ids, turn by turn, in episode order."""
    played = runner.generate(rows, seed_index=7, first_prompt=first_prompt)
    return [
        [tuple(call.output_ids) for call in episode.conversation.calls]
        for episode in played.episodes
    ]


def test_a_split_rollout_samples_what_one_process_would(engine, tokenizer):
    runner = EpisodeRunner(
        engine,
        tokenizer,
        AgentConfig(env="tests.agent.agent_testing.TurnsEnv", max_turns=3),
        group_size=2,
        params=SamplingParams(temperature=1.0, max_new_tokens=5),
    )
    whole = played_tokens(runner, ROWS, 0)
    assert [len(calls) for calls in whole] == [3, 3, 1, 1, 2, 2, 3, 3, 1, 1, 2, 2]
    split = played_tokens(runner, ROWS[:1], 0) + played_tokens(runner, ROWS[1:4], 1)
    split += played_tokens(runner, ROWS[4:], 4)
    assert split == whole
    # and the samples differ between episodes (the ids are not all one stream)
    assert len({calls[0] for calls in whole}) > 1
