"""A rollout runner on a tiny model, for the runner and worker tests."""

from tiny_models import small_model

from ardea.data import make_task
from ardea.model import build_char_tokenizer
from ardea.reward import RewardScorer
from ardea.rollout import EngineSpec, RolloutRunner, SamplingParams, make_engine

TOKENIZER = build_char_tokenizer()
TASK = make_task("arithmetic", digits=2)


def length_reward(prompts, completions, rows):
    return [float(len(c)) for c in completions]


def one(prompts, completions, rows):
    return [1.0 for _ in completions]


def make_runner(temperature=1.0, group_size=3, max_new_tokens=6, reward=length_reward, **kwargs):
    policy = small_model(TOKENIZER, seed=3)
    runner = RolloutRunner(
        make_engine("in_process", EngineSpec.of(policy, TOKENIZER), module=policy),
        TOKENIZER,
        RewardScorer([(reward, 1.0)], timeout_s=10.0),
        group_size=group_size,
        params=SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens),
        **kwargs,
    )
    return runner, policy


EXAMPLES = TASK.examples("train", 4)


def rollout(runner, examples=EXAMPLES, *, seed_index=0):
    """Generate and score in one call (the RL step does the two in separate phases)."""
    return runner.score(runner.generate(examples, seed_index=seed_index))
