"""Train-inference mismatch on purpose: does ardea see it, and do TIS / MIS bring the
gradient back to the on-policy one?

Set-up (every number in float64 on the trainer's side): a tiny Qwen2 policy π (hidden 64, 2
layers, random init) and an "engine" that samples from a perturbed copy of it — its LM head
plus Gaussian noise of ``--noise`` times the head's own std, a controllable stand-in for an
engine with other kernels or precision. One-token completions of ``--prompts`` arithmetic
prompts, reward 1 for a digit, so the **exact on-policy gradient** is a finite sum over the
vocabulary: ``g* = Σ_prompts Σ_y π(y) (r(y) − E_π[r]) ∇ log π(y)``.

Estimators from ``--group`` samples per prompt (group-mean baseline), the loss of ardea's
``ardea.algo.ppo`` (ε = 0.2) at the step's first pass (trainer = proximal policy):

- ``on-policy``: samples from π itself (what a matched engine would give; the noise floor);
- ``uncorrected``: samples from the engine, ratio against the engine's log-probs (ardea
  without ``algo.mismatch``): clipping zeroes the tokens whose ratio left [0.8, 1.2];
- ``token_tis`` (cap 2), ``token_mis`` ([0.5, 2]): ratio against π, each token weighted by
  ``ardea.algo.correction_weights`` (what ``algo.mismatch.mode`` does).

Reported per noise level, mean over ``--seeds`` sampling seeds: the ``mismatch/*`` metrics
of the engine's samples (what a run logs), and each estimator's cosine similarity and
relative error ``‖g − g*‖ / ‖g*‖`` against the exact gradient.

    python benchmarks/bench_mismatch.py            # the table in benchmarks/README.md
    python benchmarks/bench_mismatch.py --smoke    # one noise level, 2 seeds
"""

from __future__ import annotations

import argparse
import copy
import json

import torch

from ardea.algo import PolicyLossInputs, correction_weights, mismatch_metrics, ppo
from ardea.model import build_char_tokenizer, build_tiny_model

DIGITS = [str(d) for d in range(10)]


def next_token_logprobs(model, prompts: torch.Tensor) -> torch.Tensor:
    """``(P, V)`` log-probs of the token after each prompt (prompts of equal length)."""
    return torch.log_softmax(model(input_ids=prompts).logits[:, -1].double(), dim=-1)


def flat_grad(model, loss: torch.Tensor) -> torch.Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])  # fmt: skip


def exact_gradient(model, prompts, reward) -> torch.Tensor:
    """``Σ_p Σ_y π(y) (r(y) − E_π r) ∇ log π(y)`` (the expected on-policy gradient of
    ``−A log π``'s negative: the ascent direction)."""
    logp = next_token_logprobs(model, prompts)  # (P, V)
    probs = logp.exp().detach()
    advantage = reward[None, :] - (probs * reward[None, :]).sum(-1, keepdim=True)
    return flat_grad(model, (probs * advantage * logp).sum())


def sampled_gradient(model, prompts, reward, tokens, behaviour, mode) -> torch.Tensor:
    """The ascent direction of ardea's PPO loss at the first pass on ``tokens (P, G)``
    sampled with log-probs ``behaviour (P, G)``."""
    logp_all = next_token_logprobs(model, prompts)  # (P, V)
    logp = logp_all.gather(1, tokens)  # (P, G)
    r = reward[tokens]
    advantage = r - r.mean(dim=1, keepdim=True)
    mask = torch.ones_like(logp, dtype=torch.bool)
    if mode in ("on-policy", "uncorrected"):
        old = behaviour
    else:
        old = logp.detach()  # the proximal policy: the trainer before the update
        advantage = advantage * correction_weights(
            logp.detach(), behaviour, mask, mode=mode, cap=2.0, low=0.5, high=2.0
        )
    loss, _ = ppo(PolicyLossInputs(logp, old, advantage, mask), eps_clip=0.2)
    return -flat_grad(model, loss) * tokens.numel()  # ascent direction, summed over samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="one noise level, 2 seeds")
    args = parser.parse_args()
    if args.smoke:
        args.noise, args.seeds, args.group = [1.0], 2, 16
    tokenizer = build_char_tokenizer()
    size = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
    policy = build_tiny_model(tokenizer, **size, seed=0).double().eval()
    texts = [f"{a}+{b}=" for a, b in zip(range(100, 100 + 7 * args.prompts, 7), range(200, 200 + 3 * args.prompts, 3))]  # fmt: skip
    prompts = torch.tensor([tokenizer(t)["input_ids"] for t in texts])
    reward = torch.zeros(len(tokenizer), dtype=torch.float64)
    reward[tokenizer.convert_tokens_to_ids(DIGITS)] = 1.0
    exact = exact_gradient(policy, prompts, reward)
    modes = ("on-policy", "uncorrected", "token_tis", "token_mis")
    rows = []
    for noise in args.noise:
        engine = copy.deepcopy(policy)
        with torch.no_grad():
            head = engine.lm_head.weight
            head.add_(noise * head.std() * torch.randn(head.shape, generator=torch.Generator().manual_seed(1), dtype=head.dtype))  # fmt: skip
            engine_logp = next_token_logprobs(engine, prompts)  # (P, V)
            trainer_logp = next_token_logprobs(policy, prompts)
        stats = {m: {"cos": 0.0, "rel": 0.0} for m in modes}
        seen = {}
        for seed in range(args.seeds):
            gen = torch.Generator().manual_seed(seed)
            for mode in modes:
                source = trainer_logp if mode == "on-policy" else engine_logp
                tokens = torch.multinomial(source.exp(), args.group, replacement=True, generator=gen)  # fmt: skip
                behaviour = source.gather(1, tokens)
                g = sampled_gradient(policy, prompts, reward, tokens, behaviour, mode)
                g = g / args.group  # a sum over prompts of per-prompt means, like g*
                stats[mode]["cos"] += float(torch.nn.functional.cosine_similarity(g, exact, dim=0)) / args.seeds  # fmt: skip
                stats[mode]["rel"] += float((g - exact).norm() / exact.norm()) / args.seeds
                if mode == "uncorrected" and seed == 0:
                    mask = torch.ones_like(behaviour, dtype=torch.bool)
                    seen = {k: float(v) for k, v in mismatch_metrics(trainer_logp.gather(1, tokens), behaviour, mask).items()}  # fmt: skip
        row = {"noise": noise, **seen, **{f"{m}_{k}": v for m, s in stats.items() for k, v in s.items()}}  # fmt: skip
        print(json.dumps(row))
        rows.append(row)
    print("| noise | abs_diff_mean | kl_k3 | ratio_outside | cosine to g*: on-policy / uncorrected / token_tis / token_mis | rel. error: on-policy / uncorrected / token_tis / token_mis |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        cos = " / ".join(f"{r[f'{m}_cos']:.3f}" for m in modes)
        rel = " / ".join(f"{r[f'{m}_rel']:.2f}" for m in modes)
        print(f"| {r['noise']} | {r['mismatch/abs_diff_mean']:.3f} | {r['mismatch/kl_k3']:.3f} | {r['mismatch/ratio_outside']:.2f} | {cos} | {rel} |")  # fmt: skip


if __name__ == "__main__":
    main()


# ---------------------------------------------------------------- a learning run
# `rollout.engine=bench_mismatch.noisy_engine` (with benchmarks/ on PYTHONPATH): the
# in-process engine on its own copy of the policy whose LM head gets Gaussian noise of
# ARDEA_BENCH_NOISE x the head's std after every weight update (a fixed noise pattern), so
# its behaviour log-probs describe another distribution than the trainer's.
def noisy_engine(spec, *, module=None, version=0):
    import os

    from ardea.rollout import InProcessEngine, own_copy

    noise = float(os.environ.get("ARDEA_BENCH_NOISE", "0"))

    class NoisyEngine(InProcessEngine):
        def update_weights(self, weights, version):
            super().update_weights(weights, version)
            self._perturb()

        def _perturb(self):
            with torch.no_grad():
                head = self._model.lm_head.weight
                gen = torch.Generator().manual_seed(1)
                head.add_(noise * head.std() * torch.randn(head.shape, generator=gen).to(head))

    engine = NoisyEngine(
        own_copy(module), pad_token_id=spec.tokenizer.pad_token_id,
        eos_token_ids=list(spec.stop_token_ids), version=version, precision=spec.precision,
    )  # fmt: skip
    engine._perturb()
    return engine
