"""Multi-turn rollout throughput: episodes per second, every waiting episode generated in one
engine call (the episode runner) against the same episodes played one at a time.

    python benchmarks/bench_agent_rollout.py            # 64 guess_number episodes, 4 turns
    python benchmarks/bench_agent_rollout.py --smoke    # seconds: 8 episodes, no verdict

Workload: the tiny default model (hidden 128, 4 layers, random weights, fp32) plays
``guess_number`` (1..16, 4 turns, 4 new tokens per reply, temperature 1) on ``--rows`` rows ×
``--group`` episodes. Batched: one :meth:`EpisodeRunner.generate` call (per turn, one engine
call for all episodes still playing). One at a time: the same rows and seeds, each episode
played alone (one engine call per reply). Both sides build their trajectory batch. Best of
``--repeats`` runs, one torch thread by default. Exit status 1 if batching is not faster
(``--smoke`` only checks that the script runs).
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from ardea.agent import env_class
from ardea.agent.episodes import EpisodeRunner
from ardea.config import AgentConfig
from ardea.model import build_char_tokenizer, build_tiny_model
from ardea.rollout import EngineSpec, SamplingParams, make_engine


def runner(smoke: bool, group: int) -> EpisodeRunner:
    tokenizer = build_char_tokenizer(model_max_length=512)
    size = dict(hidden_size=32, num_layers=1) if smoke else dict(hidden_size=128, num_layers=4)
    model = build_tiny_model(tokenizer, max_position_embeddings=512, seed=0, **size).eval()
    return EpisodeRunner(
        make_engine("in_process", EngineSpec.of(model, tokenizer), module=model),
        tokenizer,
        AgentConfig(env="guess_number", env_args={"high": 16}, max_turns=4),
        group_size=group,
        params=SamplingParams(temperature=1.0, max_new_tokens=4),
    )


def batched(r: EpisodeRunner, rows) -> int:
    played = r.generate(rows, seed_index=0)
    r.score(played)
    return len(played.episodes)


def one_at_a_time(r: EpisodeRunner, rows) -> int:
    solo = copy.copy(r)
    solo.group_size = 1  # one episode per call
    count = 0
    for i, row in enumerate(rows):
        for g in range(r.group_size):
            solo.score(solo.generate([row], seed_index=(i, g)))
            count += 1
    return count


def best_rate(fn, r, rows, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        episodes = fn(r, rows)
        best = min(best, time.perf_counter() - start)
    return episodes / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = default)")
    parser.add_argument("--smoke", action="store_true", help="8 episodes, one run; exit 0")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smoke:
        args.rows, args.group, args.repeats = 4, 2, 1
    r = runner(args.smoke, args.group)
    rows = env_class("guess_number").rows(args.rows, 0, split="train", high=16)
    fast = best_rate(batched, r, rows, args.repeats)
    slow = best_rate(one_at_a_time, r, rows, args.repeats)
    print("| episodes | batched episodes/s | one at a time episodes/s | speed-up |")
    print("|---|---|---|---|")
    print(f"| {len(rows) * args.group} | {fast:.1f} | {slow:.1f} | {fast / slow:.1f}x |")
    print(json.dumps({"episodes": len(rows) * args.group, "batched": fast, "sequential": slow}))
    if not args.smoke and fast <= slow:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
