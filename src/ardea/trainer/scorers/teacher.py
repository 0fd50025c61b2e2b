"""On-policy distillation: a teacher scores the student's own samples token by token.

For every sampled token ``y_t`` of the rollout the teacher's log-prob ``log q(y_t)`` is set
against the student's behaviour log-prob ``log p(y_t)`` (the engine's, at the sampling
distribution; the teacher is scored at the same temperature, top-k and top-p), and the
token gets the process reward

    r_t = -coef * KL_t,   KL_t = log p - log q              (algo.teacher.kl = reverse_k1)
                          KL_t = q/p - 1 - log(q/p)          (reverse_k3)

a one-sample estimate of the reverse KL ``KL(p || q)`` at that token (Agarwal et al. 2024,
GKD; Lu & Thinking Machines 2025, "On-policy distillation": k1 as the per-token
advantage). The rewards reach the advantages through
:class:`ardea.algo.AdvantageInputs` ``.process_rewards`` (GRPO's estimators add each token's
own to its advantage, GAE takes them as rewards), beside any task reward
(``reward.functions``; a weight of 0 logs the task reward without training on it).

``kl = forward_topk`` is a loss term instead of a reward: at every sampled position the
teacher's ``top_k`` most likely next tokens and their log-probs are pinned on the rollout
(``teacher_top_ids``, ``teacher_top_logprobs``: at the sampling temperature, untruncated),
and each update adds

    coef * agg(KL_t),   KL_t = sum_j q̃_j (log q̃_j - log p_j)        (topk_forward_kl)

over the student's log-probs ``p_j`` of the same tokens (``q̃``: the teacher renormalised
over its top k; ``agg``: ``algo.ppo.loss_agg_mode``, as the policy loss). Forward KL
teaches the tokens the student did not sample too (verl's top-k distillation loss).

The teacher is a Hugging Face causal LM from ``algo.teacher.path`` (loaded in
``model.dtype`` on the policy's device, frozen, wrapped like the policy) with the policy's
tokenizer: the same token ids must mean the same text, so a different vocabulary is a
:class:`~ardea.errors.ConfigError`. It scores each rollout once, when the RL step pins the frozen scorers
(:class:`~ardea.trainer.scorers.FrozenScorers`).

Metrics: ``teacher/reverse_kl`` (mean k1 estimate ``log p - log q`` over the trained
tokens, whichever ``kl`` is chosen: the distance left to the teacher),
``teacher/reward_mean`` (mean ``r_t`` over them; reverse KLs) and ``train/forward_kl``
(the mean ``KL_t`` of the updates; forward_topk).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import Tensor
from transformers import AutoConfig

from ardea.algo import Aggregation, agg_loss, kl_penalty, masked_mean, topk_forward_kl
from ardea.data import TrajectoryBatch
from ardea.errors import ConfigError
from ardea.model import load_model_and_tokenizer, load_tokenizer
from ardea.rollout.engines.vllm.scoring import VLLMPromptScorer
from ardea.rollout.engines.vllm.server import LaunchedServer
from ardea.trainer.row_shards import ONE_PROCESS, RowShards
from ardea.trainer.scorers.token_scorer import ServedTokenScorer, TokenScorer

ESTIMATORS = {"reverse_k1": "k1", "reverse_k3": "k3"}
STARTUP_TIMEOUT_S = 600.0  # a teacher's vLLM server may take this long to answer /health


class Teacher:
    """The teacher's part of a rollout (module docstring).

    Args:
        scorer: the teacher's :class:`TokenScorer`.
        kl: ``reverse_k1``, ``reverse_k3`` or ``forward_topk``.
        coef: the weight of the reward or of the loss term.
        top_k: the teacher's tokens per position of ``forward_topk``.
    """

    def __init__(self, scorer: TokenScorer, *, kl: str, coef: float, top_k: int = 20) -> None:
        self.scorer = scorer
        self.kl = kl
        self.coef = float(coef)
        self.top_k = int(top_k)

    @classmethod
    def from_config(cls, config: Any, *, tokenizer: Any, wrap: Any, device: Any) -> Teacher:
        """The teacher of ``config.algo.teacher``: its path loaded on ``device`` and
        ``wrap``-ped like the policy, or served by vLLM (``engine: vllm``); ``tokenizer``:
        the policy's, which the teacher must share."""
        section = config.algo.teacher
        if section.engine == "vllm":
            scorer = served_scorer(config, tokenizer)
            return cls(scorer, kl=section.kl, coef=section.coef, top_k=section.top_k)
        model, teacher_tokenizer = load_model_and_tokenizer(
            section.path, dtype=config.model.dtype, device=str(device)
        )
        check_same_vocabulary(section.path, teacher_tokenizer, tokenizer)
        check_top_k(section, model.get_output_embeddings().weight.shape[0])
        wrapped = wrap(model.requires_grad_(False).eval(), trainable=False)
        scorer = TokenScorer(wrapped, config.model.logprob_chunk_size, replays_routing=False)
        return cls(scorer, kl=section.kl, coef=section.coef, top_k=section.top_k)

    def close(self) -> None:
        """Stop the teacher's vLLM server if ardea started it."""
        self.scorer.close()

    def pin(
        self, batch: TrajectoryBatch, metrics: dict[str, float], rows: RowShards = ONE_PROCESS
    ) -> TrajectoryBatch:
        """Score the rollout once: ``batch`` with the teacher's top tokens pinned under
        ``forward_topk``, else with the ``(N, S)`` next-token aligned process rewards
        ``-coef * KL_t`` on the trained tokens (0 elsewhere) pinned as ``process_rewards``;
        adds the ``teacher/*`` metrics. ``rows``: this rank's share of the rows to score."""
        mask = batch.action_mask
        student = batch.behaviour_logprobs  # (N, S), the sampled tokens' log p
        forward = self.kl == "forward_topk"
        top = self.top_k if forward else 0
        scores = rows.map(batch, lambda share: self.scorer.scores(share, top=top))
        teacher = scores.logprobs  # (N, S), their log q
        gap = (student - teacher).where(mask, 0.0)  # behaviour log-probs may be NaN off mask
        metrics["teacher/reverse_kl"] = float(masked_mean(gap, mask))
        if forward:
            return batch.pin(
                teacher_top_ids=scores.top_ids, teacher_top_logprobs=scores.top_logprobs
            )
        rewards = -self.coef * kl_penalty(student, teacher, ESTIMATORS[self.kl])
        rewards = rewards.where(mask, 0.0)
        metrics["teacher/reward_mean"] = float(masked_mean(rewards, mask))
        return batch.pin(process_rewards=rewards)


def check_teacher(strategy: type, config: Any) -> None:
    """A :class:`ConfigError` when ``algo.teacher`` is set for a strategy that takes no
    per-token rewards (its class's ``supports_teacher``)."""
    if config.algo.teacher.path is not None and not getattr(strategy, "supports_teacher", False):
        raise ConfigError(
            f"algo.teacher is set but algo.name={config.algo.name} does not learn from a "
            "teacher (per-token rewards or a forward-KL term); distil with online_grpo or "
            "online_ppo"
        )


def forward_kl_term(
    config: Any,
    batch: TrajectoryBatch,
    logprobs_at: Tensor | None,
    agg: Aggregation,
    metrics: dict,
) -> Tensor | float:
    """``algo.teacher.coef * agg(KL_t)`` over the trained tokens of ``batch`` (module
    docstring; ``logprobs_at``: the student's ``(N, S, k)`` log-probs of the pinned teacher
    tokens, ``agg``: the policy loss's aggregation); records ``train/forward_kl``. 0 when no
    teacher tokens are pinned."""
    if batch.teacher_top_ids is None:
        return 0.0
    mask = batch.action_mask
    kl = topk_forward_kl(logprobs_at, batch.teacher_top_logprobs)  # (N, S)
    term = agg_loss(kl, mask, agg)
    metrics["train/forward_kl"] = masked_mean(kl.detach(), mask, agg.tokens)
    return config.algo.teacher.coef * term


def served_scorer(config: Any, student_tokenizer: Any) -> ServedTokenScorer:
    """The scorer of a teacher served by vLLM (``algo.teacher.engine: vllm``): on the
    server at ``url``, or on one started on ``path`` with ``algo.teacher.python`` (once in
    the job: by rank 0 under torchrun, :func:`started_once`). Refused
    unless the rollouts are sampled at temperature 1 (or greedy) without top-k / top-p (the
    reverse KLs; forward_topk reads untruncated log-probs, so only the temperature matters):
    vLLM's prompt log-probs describe only that distribution."""
    section, rollout = config.algo.teacher, config.rollout
    truncated = section.kl != "forward_topk" and (rollout.top_k != 0 or rollout.top_p != 1.0)
    if rollout.temperature not in (0.0, 1.0) or truncated:
        raise ConfigError(
            f"algo.teacher.engine=vllm scores at temperature 1 without top-k / top-p (vLLM's "
            f"prompt log-probs); the rollouts are sampled at rollout.temperature="
            f"{rollout.temperature}, top_k={rollout.top_k}, top_p={rollout.top_p}: sample at "
            "temperature 1 (top_k 0, top_p 1) or use algo.teacher.engine=in_process"
        )
    tokenizer = load_tokenizer(section.path)
    check_same_vocabulary(section.path, tokenizer, student_tokenizer)
    model_config = AutoConfig.from_pretrained(section.path)
    check_top_k(section, int(model_config.vocab_size))
    server = None
    url = section.url
    if url is None:
        server = LaunchedServer(
            section.python, Path(section.path),
            Path(config.trainer.output_dir) / "teacher" / "server.log",
            dtype=config.model.dtype,
            max_model_len=int(getattr(model_config, "max_position_embeddings", 0) or 2048),
            extra_args=list(section.server_args), startup_timeout_s=STARTUP_TIMEOUT_S,
        )  # fmt: skip
        url, server = started_once(server)
    try:
        scorer = VLLMPromptScorer(url, timeout_s=section.timeout_s)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    return ServedTokenScorer(scorer, server)


def started_once(server: LaunchedServer) -> tuple[str, LaunchedServer | None]:
    """``server`` started by this process, or under torchrun by rank 0 alone: its URL is
    broadcast and the other ranks score there (with their share of the rows), holding no
    server of their own (None). A failure on rank 0 reaches the others as a
    :class:`ConfigError` naming it, instead of a collective timeout."""
    if not (dist.is_available() and dist.is_initialized()):
        return server.start(), server
    box: list[tuple[str, str] | None] = [None]
    failure: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            box = [("url", server.start())]
        except BaseException as err:  # told to the other ranks, then raised here
            box, failure = [("error", f"{type(err).__name__}: {err}")], err
    dist.broadcast_object_list(box, src=0)
    if failure is not None:
        raise failure
    kind, value = box[0]
    if kind == "error":
        raise ConfigError(f"rank 0 could not start the teacher's vLLM server: {value}")
    return value, server if dist.get_rank() == 0 else None


def check_top_k(section: Any, vocab: int) -> None:
    """A :class:`ConfigError` when ``forward_topk`` asks for more tokens than the teacher has."""
    if section.kl == "forward_topk" and section.top_k > vocab:
        raise ConfigError(
            f"algo.teacher.top_k={section.top_k} exceeds the teacher's {vocab} output tokens"
        )


def check_same_vocabulary(path: str, teacher: Any, student: Any) -> None:
    """A :class:`ConfigError` unless the two tokenizers map the same strings to the same ids."""
    theirs, ours = teacher.get_vocab(), student.get_vocab()
    if theirs == ours:
        return
    differing = sorted(set(theirs.items()) ^ set(ours.items()))[:3]
    raise ConfigError(
        f"algo.teacher.path={path!r}: the teacher's tokenizer differs from the policy's "
        f"({len(theirs)} against {len(ours)} tokens; e.g. {differing}); distillation compares "
        "the log-probs of the same token ids, so the teacher must share the policy's tokenizer"
    )
