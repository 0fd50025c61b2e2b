"""Held-out evaluation: greedy exact-match accuracy and sampled pass@k on a task, the mean
reward of greedy completions on held-out prompt records, the loss on held-out samples."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ardea.data import Example, PromptSample, RolloutPrompt, Task, reward_row, rollout_prompt_ids
from ardea.errors import ArdeaError
from ardea.reward import RewardScorer, build_scorer
from ardea.rollout import GenerationEngine, SamplingParams
from ardea.rollout.shares import RolloutShares
from ardea.trainer.strategies import OnlineStrategy


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al., 2021, eq. 1).

    ``pass@k = 1 − C(n − c, k) / C(n, k)``; 1 when ``n − c < k``.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_at_k(answers: Sequence[Hashable | None], scores: Sequence[float], k: int) -> float:
    """maj@k of one prompt from its ``n`` samples' extracted answers and scores: the samples
    split in order into ``n // k`` disjoint groups of ``k`` (a remainder is left out); in
    each group the answer given most often wins (a tie: the one given first; samples with no
    answer do not vote) and the group counts 1 when a sample giving the winner scores > 0;
    the mean over the groups."""
    n = len(answers)
    if len(scores) != n or not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n answers and n scores, got k={k}, "
                         f"{n} answers, {len(scores)} scores")  # fmt: skip
    wins = 0
    for start in range(0, n - n % k, k):
        group = [(a, s) for a, s in zip(answers[start : start + k], scores[start : start + k])]
        votes = Counter(a for a, _ in group if a is not None)
        if votes:
            top = max(votes.values())
            winner = next(a for a, _ in group if votes.get(a) == top)
            wins += next(s for a, s in group if a == winner) > 0
    return wins / (n // k)


def sampled_metrics(
    correct: Sequence[int], n: int, k: int, majority: Sequence[float] | None = None
) -> dict[str, float]:
    """From ``correct[i]`` right answers among ``n`` samples of prompt ``i``: ``avg@n`` (the
    mean of ``c_i / n``: pass@1 averaged over the n samples) and the unbiased ``pass@k``
    (:func:`pass_at_k`), and from ``majority[i]`` (:func:`majority_at_k`) ``maj@k``, each a
    mean over the prompts, with its standard error over them (``<name>_se``: the per-prompt
    values' sample standard deviation over ``sqrt(P)``; left out for a single prompt)."""
    out: dict[str, float] = {}
    named = [
        (f"avg@{n}", [c / n for c in correct]),
        (f"pass@{k}", [pass_at_k(n, c, k) for c in correct]),
    ]
    if majority is not None:
        named.append((f"maj@{k}", list(majority)))
    for name, values in named:
        mean = sum(values) / len(values)
        out[name] = mean
        if len(values) > 1:
            variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
            out[f"{name}_se"] = math.sqrt(variance / len(values))
    return out


@dataclass
class EvalResult:
    """Scores of one evaluation; ``samples`` holds (prompt, completion, score) triples."""

    metrics: dict[str, float]
    samples: list[tuple[str, str, float]]


def _generate_texts(
    engine: GenerationEngine,
    tokenizer: Any,
    examples: Sequence[RolloutPrompt],
    params: SamplingParams,
    *,
    chat_template: bool,
    batch_size: int,
    first: int = 0,
) -> list[list[str]]:
    """``params.n`` decoded completions per example, in example order; ``examples[0]`` is
    example ``first`` of the evaluation, and its completions sample with the random numbers
    of their rows in the whole evaluation (whatever the batches or the ranks' shares)."""
    prompts = [rollout_prompt_ids(tokenizer, e, chat_template=chat_template) for e in examples]
    texts: list[list[str]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        rows = range((first + start) * params.n, (first + start + len(chunk)) * params.n)
        completions = engine.generate(chunk, dataclasses.replace(params, row_ids=list(rows)))
        for i in range(0, len(completions), params.n):
            texts.append(
                [
                    tokenizer.decode(c.token_ids, skip_special_tokens=True)
                    for c in completions[i : i + params.n]
                ]
            )
    return texts


@dataclass(frozen=True)
class SampledEval:
    """How an evaluation samples: ``n`` completions per prompt at these settings, scored as
    avg@n, pass@k and maj@k (:func:`sampled_metrics`)."""

    n: int
    k: int
    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.n:
            raise ArdeaError(f"pass@k and maj@k need 1 <= k <= n samples, got k={self.k}, "
                             f"n={self.n}")  # fmt: skip
        if self.temperature == 0:
            raise ArdeaError(
                f"avg@{self.n} and pass@{self.k} need sampled completions, but the sampling "
                "temperature is 0 (greedy); set rollout.temperature > 0"
            )

    def params(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_new_tokens=self.max_new_tokens, n=self.n, seed=self.seed,
        )  # fmt: skip


def extracts_answers(task: Task) -> bool:
    """Whether ``task`` overrides :meth:`~ardea.data.Task.extract_answer` (maj@k needs it)."""
    return type(task).extract_answer is not Task.extract_answer


def evaluate_task(
    engine: GenerationEngine,
    tokenizer: Any,
    task: Task,
    examples: Sequence[Example],
    *,
    max_new_tokens: int,
    chat_template: bool = False,
    batch_size: int = 256,
    sampled: SampledEval | None = None,
    shares: Any = None,
) -> EvalResult:
    """Greedy accuracy on ``examples``; with ``sampled`` also the sampled metrics.

    Returns metrics ``accuracy`` (greedy exact match, fraction) and, with ``sampled``, from
    its ``n`` samples per prompt ``avg@n``, ``pass@k`` (estimated without bias) and, when
    the task extracts answers, ``maj@k``, with their standard errors
    (:func:`sampled_metrics`). ``shares`` (:class:`~ardea.rollout.shares.RolloutShares`):
    each rank of a torchrun job generates and scores its share of the examples, and every
    rank gets every example's scores.
    """
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    options = {"chat_template": chat_template, "batch_size": batch_size}

    def scored(part: Sequence[Example], first: int) -> list[tuple]:
        """Per example: its greedy completion and score, and with ``sampled`` its right
        samples and maj@k."""
        texts = _generate_texts(engine, tokenizer, part, greedy, first=first, **options)
        out = [(t[0], task.score(t[0], e)) for t, e in zip(texts, part)]
        if sampled is None:
            return out
        groups = _generate_texts(
            engine, tokenizer, part, sampled.params(), first=first,
            chat_template=chat_template, batch_size=max(1, batch_size // sampled.n),
        )  # fmt: skip
        for i, (g, e) in enumerate(zip(groups, part)):
            scores = [task.score(t, e) for t in g]
            majority = None
            if extracts_answers(task):
                answers = [task.extract_answer(t, e) for t in g]
                majority = majority_at_k(answers, scores, sampled.k)
            out[i] += (sum(s > 0 for s in scores), majority)
        return out

    records = _by_example(scored, examples, shares)
    metrics = {"accuracy": sum(r[1] for r in records) / len(records)}
    samples = [(e.prompt, r[0], r[1]) for e, r in zip(examples, records)]
    if sampled is not None:
        majority = [r[3] for r in records] if extracts_answers(task) else None
        metrics |= sampled_metrics([r[2] for r in records], sampled.n, sampled.k, majority)
    return EvalResult(metrics, samples)


def _by_example(scored: Callable[[Sequence, int], list], items: Sequence, shares: Any) -> list:
    """``scored(items, 0)``, one record per item: in one process the call itself; with
    ``shares`` each rank scores its share of the items and gathers the others'."""
    if shares is None:
        return scored(items, 0)
    share = shares.share(len(items))
    parts = shares.gathered(lambda: scored(items[share.start : share.stop], share.start))
    return [record for part in parts for record in part]


def evaluate_rewards(
    engine: GenerationEngine,
    tokenizer: Any,
    scorer: RewardScorer,
    prompts: Sequence[PromptSample],
    *,
    max_new_tokens: int,
    batch_size: int = 256,
    shares: Any = None,
) -> EvalResult:
    """One greedy completion per held-out prompt record, scored by the reward functions
    with the record's row; metrics ``reward_mean`` (the weighted sum, averaged over prompts;
    under ``reward.on_error=mask`` over those whose reward did not fail) and
    ``reward_failed_fraction``. ``shares``: as :func:`evaluate_task`'s."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)

    def scored(part: Sequence[PromptSample], first: int) -> list[tuple[str, float, bool]]:
        texts = _generate_texts(
            engine, tokenizer, part, greedy, chat_template=False, batch_size=batch_size,
            first=first,
        )  # fmt: skip
        done = [t[0] for t in texts]
        result = scorer.score([p.prompt for p in part], done, [reward_row(p) for p in part])
        return list(zip(done, result.rewards, result.failed))

    records = _by_example(scored, prompts, shares)
    counted = [r for _, r, failed in records if not (failed and scorer.on_error == "mask")]
    metrics = {
        "reward_mean": sum(counted) / len(counted) if counted else float("nan"),
        "reward_failed_fraction": sum(failed for _, _, failed in records) / len(records),
    }
    return EvalResult(metrics, [(p.prompt, t, r) for p, (t, r, _) in zip(prompts, records)])


def sampled_eval(config) -> SampledEval | None:
    """The sampling of ``trainer.eval_samples`` / ``trainer.eval_k`` at the rollout's
    settings, or None (greedy only)."""
    trainer, rollout = config.trainer, config.rollout
    if not trainer.eval_samples:
        return None
    return SampledEval(
        n=trainer.eval_samples, k=trainer.eval_k or trainer.eval_samples,
        temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
        max_new_tokens=rollout.max_new_tokens, seed=trainer.seed,
    )  # fmt: skip


class Evaluator:
    """The evaluations of a training run, each optional.

    - ``eval/accuracy``: greedy exact match on the task's held-out split (when a task is set),
      and with ``trainer.eval_samples`` its sampled ``eval/avg@n``, ``eval/pass@k`` and
      ``eval/maj@k`` (:func:`evaluate_task`);
    - ``eval/reward_mean``: online strategies, mean reward of greedy completions of the
      ``data.eval_path`` prompt records (when set), by ``reward.functions``;
    - ``eval/loss``: other strategies, the loss on ``data.eval_path`` samples (when set, or
      a task's held-out preference pairs for preference strategies), with the strategy's
      ``eval_metrics`` (e.g. ``eval/rm_accuracy``);
    - ``eval/success_rate`` (+ ``eval/reward_mean``, ``eval/turns_per_episode``): agent runs,
      one greedy episode per held-out environment row.

    With neither a task nor ``data.eval_path`` nothing is evaluated. Each evaluation also
    appends a few decoded completions to ``samples.jsonl``.
    """

    def __init__(
        self, config, task, engine, tokenizer, strategy, held_out_samples, precision
    ) -> None:
        self.config = config
        self.precision = precision
        self.task = task
        self.engine = engine
        self.tokenizer = tokenizer
        self.strategy = strategy
        self.held_out_samples = held_out_samples
        generates = strategy.model_head == "causal_lm"  # a reward model's run generates nothing
        self.examples = (
            task.examples("test", config.data.eval_size) if task is not None and generates else []
        )
        self.sampled = sampled_eval(config) if self.examples else None
        self.scorer = None
        self.agent = None  # an agent run's AgentEvaluation (set by the trainer)
        if held_out_samples and isinstance(strategy, OnlineStrategy):
            self.scorer = build_scorer(config.reward, task)

    def generated(self, step: int, run_dir, shares: RolloutShares) -> dict[str, float]:
        """The evaluations that generate (agent episodes, rewards, the task's accuracy), on
        every rank (``run_dir``: where rank 0 appends samples, None elsewhere): under
        torchrun each rank generates and scores its share of the held-out examples."""
        metrics: dict[str, float] = {}
        options = {"max_new_tokens": self.config.rollout.max_new_tokens,
                   "batch_size": self.config.rollout.batch_size, "shares": shares}  # fmt: skip
        if self.agent is not None:
            with self.precision.autocast():
                agent_metrics, samples = self.agent.run(shares)
            metrics.update(agent_metrics)
            append_samples(run_dir, step, samples[:SAMPLES_PER_EVAL])
        if self.scorer is not None:
            result = evaluate_rewards(
                self.engine, self.tokenizer, self.scorer, self.held_out_samples, **options
            )
            metrics.update({f"eval/{k}": v for k, v in result.metrics.items()})
            append_samples(run_dir, step, result.samples[:SAMPLES_PER_EVAL])
        if self.examples:
            result = evaluate_task(
                self.engine, self.tokenizer, self.task, self.examples, sampled=self.sampled,
                chat_template=self.config.data.chat_template, **options,
            )  # fmt: skip
            metrics.update({f"eval/{k}": v for k, v in result.metrics.items()})
            append_samples(run_dir, step, result.samples[:SAMPLES_PER_EVAL])
        return metrics

    def losses(self) -> dict[str, float]:
        """The held-out loss and the strategy's ``eval_metrics`` (offline strategies with
        held-out samples): on every rank, which the sharded policy's forward needs."""
        if self.held_out_samples and self.scorer is None:
            return self.held_out_metrics()
        return {}

    @torch.no_grad()
    def held_out_metrics(self) -> dict[str, float]:
        """``eval/loss``: the strategy's loss over all held-out samples (normalised over the
        whole set, e.g. token-mean or pair-mean), and ``eval/<name>`` for each of its
        ``eval_metrics`` (``train/<name>`` of the same loss)."""
        size = self.config.trainer.batch_size // self.config.trainer.grad_accum_steps
        device = next(self.strategy.policy.parameters()).device
        batches = [
            self.strategy.collate(self.held_out_samples[i : i + size]).to(device)
            for i in range(0, len(self.held_out_samples), size)
        ]
        was_training = self.strategy.policy.training
        self.strategy.policy.eval()
        names = self.strategy.eval_metrics
        totals = dict.fromkeys(["loss", *names], 0.0)
        with self.precision.autocast():
            counts = self.strategy.step_counts(batches)  # may need a forward (KTO's)
            for batch in batches:
                loss, metrics = self.strategy.loss(batch, counts)
                totals["loss"] += float(loss)
                for name in names:
                    totals[name] += float(metrics[f"train/{name}"])
        self.strategy.policy.train(was_training)
        return {f"eval/{name}": value for name, value in totals.items()}


SAMPLES_PER_EVAL = 5


def append_samples(run_dir, step: int, samples: list[tuple[str, str, float]]) -> None:
    """Append ``(prompt, completion, score)`` records of ``step`` to ``samples.jsonl``
    (nothing when ``run_dir`` is None: a rank other than 0 under torchrun)."""
    if run_dir is None:
        return
    with (Path(run_dir) / "samples.jsonl").open("a", encoding="utf-8") as handle:
        for prompt, completion, score in samples:
            record = {"step": step, "prompt": prompt, "completion": completion, "score": score}
            handle.write(json.dumps(record) + "\n")
