"""Time token- and turn-level GAE against plain Python-loop references of the same recurrence.

    python benchmarks/bench_gae.py                 # B=64, T=4096 and T=16384
    python benchmarks/bench_gae.py --lengths 4096  # one length
    python benchmarks/bench_gae.py --smoke         # seconds: B=4, T=256, one run, no verdict

Workload: B trajectories of T next-token-aligned positions in float32, each a prompt (not
trained) followed by assistant turns separated by tool-output gaps (not trained), then
right padding; about half the rows are truncated (bootstrap from the last value).

References (they live here, not in the library):

- ``python loop``: per trajectory, per token, plain Python floats (double precision);
  the fastest pure-Python form of the recurrence, compared within a tolerance;
- ``python loop f32``: the same loop on ``numpy.float32`` scalars, so every operation
  rounds to float32 like the library -- the token level must match it bit for bit;
- ``seed column loop``: the seed documents' legacy recurrence, a Python loop over columns
  with PyTorch ops over rows (token level only; also a bit-exact reference).

The fast path is ``ardea.algo`` as shipped (compiled C scan when a C compiler exists,
otherwise the PyTorch column loop, also timed as ``torch backend``). Figures are the best
of ``--repeats`` runs, with one torch thread by default (``--threads``; the loops are
single-threaded, and on a shared 2-core machine extra OpenMP threads only add noise).
Exit status 1 if the token level is not bit-exact or the fast path is less than 10x
faster than the Python loop (``--smoke`` only checks that the script runs: exit status 0).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from ardea.algo import c_kernel_available, compute_token_level_gae, compute_turn_level_gae

GAMMA, LAMBDA = 0.99, 0.95


def make_inputs(rows: int, cols: int, seed: int = 0) -> dict:
    """Multi-turn layout: prompt, then turns of 40-400 tokens with 10-100-token tool gaps."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((rows, cols), dtype=bool)
    turn_ids = np.full((rows, cols), -1, dtype=np.int64)
    for b in range(rows):
        t = int(rng.integers(32, 256))  # prompt
        end = int(cols * rng.uniform(0.6, 1.0))
        turn = 0
        while t < end:
            length = int(rng.integers(40, 400))
            mask[b, t : min(t + length, end)] = True
            turn_ids[b, t : min(t + length, end)] = turn
            t += length + int(rng.integers(10, 100))
            turn += int(rng.integers(1, 3))  # ids may skip
    rewards = np.where(mask & (rng.random((rows, cols)) < 0.02), rng.normal(size=(rows, cols)), 0.0)
    return {
        "rewards": torch.tensor(rewards, dtype=torch.float32),
        "values": torch.tensor(rng.normal(size=(rows, cols)), dtype=torch.float32),
        "loss_mask": torch.tensor(mask),
        "turn_ids": torch.tensor(turn_ids),
        "seq_no_eos_mask": torch.tensor(rng.random(rows) < 0.5),
        "bootstrap_values": torch.tensor(rng.normal(size=rows), dtype=torch.float32),
    }


def loop_token(x: dict, real=float) -> list[list]:
    """Per-trajectory loop: column T-1 is the bootstrap slot; untrained tokens carry."""
    gamma, coef = real(GAMMA), real(GAMMA * LAMBDA)
    rows = []
    to_list = (lambda t: t.tolist()) if real is float else (lambda t: list(t.numpy()))
    for r, v, m, no_eos, boot in zip(
        to_list(x["rewards"]),
        to_list(x["values"]),
        x["loss_mask"].tolist(),
        x["seq_no_eos_mask"].tolist(),
        to_list(x["bootstrap_values"]),
    ):
        adv, nxt = real(0.0), boot if no_eos else real(0.0)
        out = [real(0.0)] * len(r)
        for t in range(len(r) - 2, -1, -1):
            if m[t]:
                adv = (r[t] + gamma * nxt - v[t]) + coef * adv
                nxt = v[t]
            out[t] = adv
        rows.append(out)
    return rows


def seed_column_loop(x: dict) -> torch.Tensor:
    """The seed's legacy recurrence: loop over columns, PyTorch ops over rows."""
    rewards, values, mask = x["rewards"], x["values"], x["loss_mask"].float()
    last = torch.zeros(rewards.shape[0])
    next_values = x["bootstrap_values"] * x["seq_no_eos_mask"]
    columns = [last]
    for t in reversed(range(rewards.shape[1] - 1)):
        delta = rewards[:, t] + GAMMA * next_values - values[:, t]
        candidate = delta + GAMMA * LAMBDA * last
        keep = mask[:, t]
        next_values = next_values * (1 - keep) + values[:, t] * keep
        last = last * (1 - keep) + candidate * keep
        columns.append(last)
    return torch.stack(columns[::-1], dim=1)


def loop_turn(x: dict) -> list[list[float]]:
    """Per-trajectory loop over turns: sum rewards, first value, recurse, broadcast back."""
    coef = GAMMA * LAMBDA
    rows = []
    for r, v, m, ids, no_eos, boot in zip(
        x["rewards"].tolist(),
        x["values"].tolist(),
        x["loss_mask"].tolist(),
        x["turn_ids"].tolist(),
        x["seq_no_eos_mask"].tolist(),
        x["bootstrap_values"].tolist(),
    ):
        turns: dict[int, list[float]] = {}
        for t in range(len(r)):
            if m[t]:
                turn = turns.setdefault(ids[t], [0.0, v[t]])
                turn[0] += r[t]
        adv_of, adv, nxt = {}, 0.0, boot if no_eos else 0.0
        for turn_id in sorted(turns, reverse=True):
            reward, value = turns[turn_id]
            adv = (reward + GAMMA * nxt - value) + coef * adv
            adv_of[turn_id], nxt = adv, value
        rows.append([adv_of[i] if ok else 0.0 for i, ok in zip(ids, m)])
    return rows


def best_of(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def run(rows: int, cols: int, repeats: int) -> bool:
    x = make_inputs(rows, cols)
    common = {
        k: x[k] for k in ("rewards", "values", "loss_mask", "seq_no_eos_mask", "bootstrap_values")
    }
    token_args = dict(common, discount=GAMMA, gae_lambda=LAMBDA)
    turn_args = dict(token_args, turn_ids=x["turn_ids"])
    print(f"\nB={rows} T={cols} ({int(x['loss_mask'].sum())} trained tokens)")
    t_fast, (fast, _) = best_of(lambda: compute_token_level_gae(**token_args), repeats * 3)
    t_torch, (slow, _) = best_of(
        lambda: compute_token_level_gae(**token_args, backend="torch"), repeats
    )
    t_py, py = best_of(lambda: loop_token(x), repeats)
    t_f32, f32 = best_of(lambda: loop_token(x, np.float32), repeats)
    t_seed, seed = best_of(lambda: seed_column_loop(x), repeats)
    f32 = torch.tensor(np.array(f32, dtype=np.float32))
    exact = torch.equal(fast, f32) and torch.equal(fast, seed) and torch.equal(slow, seed)
    close = torch.allclose(
        fast.double(), torch.tensor(py, dtype=torch.float64), rtol=1e-4, atol=1e-4
    )
    print("token level                 time      fast path is")
    print(f"  fast path ({'C' if c_kernel_available() else 'torch'})     {t_fast * 1e3:9.2f} ms")
    print(f"  torch backend          {t_torch * 1e3:9.2f} ms   {t_torch / t_fast:6.1f}x faster")
    for name, t in (
        ("python loop", t_py),
        ("python loop f32", t_f32),
        ("seed column loop", t_seed),
    ):
        print(f"  {name:<22} {t * 1e3:9.2f} ms   {t / t_fast:6.1f}x faster")
    print(f"  bit-exact vs python loop f32 and seed column loop (rtol=0, atol=0): {exact}")
    print(f"  close to the float64 python loop (1e-4): {close}")

    t_turn, (turn, _) = best_of(lambda: compute_turn_level_gae(**turn_args), repeats * 3)
    t_turn_torch, _ = best_of(lambda: compute_turn_level_gae(**turn_args, backend="torch"), repeats)
    t_turn_py, turn_py = best_of(lambda: loop_turn(x), repeats)
    turn_close = torch.allclose(
        turn.double(), torch.tensor(turn_py, dtype=torch.float64), rtol=1e-4, atol=1e-4
    )
    print("turn level")
    print(f"  fast path              {t_turn * 1e3:9.2f} ms")
    print(
        f"  torch backend          {t_turn_torch * 1e3:9.2f} ms"
        f"   {t_turn_torch / t_turn:6.1f}x faster"
    )
    print(f"  python loop            {t_turn_py * 1e3:9.2f} ms   {t_turn_py / t_turn:6.1f}x faster")
    print(f"  close to the float64 python loop (1e-4): {turn_close}")
    ok = exact and close and turn_close and t_py / t_fast >= 10 and t_turn_py / t_turn >= 10
    print(
        "  requirement (token bit-exact, >= 10x vs python loop at both levels): "
        + ("PASS" if ok else "FAIL")
    )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = default)")
    parser.add_argument("--smoke", action="store_true", help="B=4, T=256, one run; exit 0")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.lengths, args.repeats = 4, [256], 1
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"C kernel: {c_kernel_available()}"
    )
    ok = all([run(args.rows, cols, args.repeats) for cols in args.lengths])
    raise SystemExit(0 if ok or args.smoke else 1)


if __name__ == "__main__":
    main()
