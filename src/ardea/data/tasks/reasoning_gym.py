"""reasoning-gym's procedural generators as a task: ``data.task: reasoning_gym``.

reasoning-gym (``pip install reasoning-gym``) has about a hundred generators (arithmetic,
algebra, algorithmic, games, graphs, logic, ARC…), each with its own config (difficulty
ranges) and verifier (``score_answer``). One generator is ``task_args.dataset`` with its
``config``; a weighted mix is ``task_args.datasets: {name: {weight, config}}`` (reasoning-gym's
composite dataset). Every entry is a pure function of (seed, index), so the task needs no
file and no network, and the same seed gives the same problems everywhere.

Splits: one stream of entries (indices 0, 1, 2, …) is split by a keyed hash of each
question's text: a question whose hash under the seed falls below ``test_fraction`` is
held out, every other is training data, so the two are disjoint and each split is the
same whatever number of examples is asked for. The held-out split has no repeats; the
training split repeats only what the generator repeats.

Answers: with ``answer_format="tags"`` (the default, reasoning-gym's convention) the
prompt asks for the answer between ``<answer>`` and ``</answer>``, SFT demonstrates it that
way, and the answer a completion gives is its last tagged one (reasoning-gym's
``extract_answer``); with ``"plain"`` the whole completion is the answer (small models
that answer in a few tokens). The score is the generator's ``score_answer`` of that answer
against the entry. Many generators give partial credit (chain_sum scores ``-280`` for
``-28`` 0.75, for closeness); ardea's task scores are 1 or 0 (``eval/accuracy`` is their
mean, pass@k counts the ones above 0), so by default only a full score counts: 1.0, else
0.0. ``partial_credit=true`` passes the generator's score through as the reward and the
accuracy instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Hashable
from typing import Any

from ardea.data.tasks.base import SPLITS, Example, Task, register_task
from ardea.errors import ArdeaError, ConfigError

ANSWER_FORMATS = ("tags", "plain")
TAGS_INSTRUCTION = "Give your final answer between <answer> and </answer>."
POOL = 1_000_000  # entries the generators are asked for: indices the splits draw from
SCAN = 64  # examples drawn may cost at most SCAN x as many entries (repeats, the other split)


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as err:
        raise ConfigError(
            "data.task=reasoning_gym needs the reasoning-gym package: "
            "pip install 'ardea[environments]' (or pip install reasoning-gym)"
        ) from err
    return reasoning_gym


@register_task("reasoning_gym")
class ReasoningGymTask(Task):
    """Problems from reasoning-gym's procedural generators, scored by their verifiers.

    Args:
        dataset: one generator's name (``basic_arithmetic``, ``chain_sum``, ``countdown``…).
        config: that generator's config (its difficulty settings), without seed and size.
        datasets: instead of ``dataset``, a weighted mix ``{name: {"weight": w, "config":
            {...}}}`` (weight defaults to 1, config to the generator's defaults).
        answer_format: ``tags`` or ``plain`` (module docstring).
        instruction: the line after each question (default: the tags instruction for
            ``tags``, none for ``plain``; '' for none).
        test_fraction: the share of distinct questions held out (default 0.2).
        partial_credit: score with the generator's own score in [0, 1] instead of 1 for a
            full score and 0 otherwise (module docstring).
        seed: the generators' seed and the split's key (``data.seed``).
    """

    def __init__(
        self,
        dataset: str | None = None,
        config: dict[str, Any] | None = None,
        datasets: dict[str, dict[str, Any]] | None = None,
        answer_format: str = "tags",
        instruction: str | None = None,
        test_fraction: float = 0.2,
        partial_credit: bool = False,
        seed: int = 0,
    ) -> None:
        rg = _reasoning_gym()
        if answer_format not in ANSWER_FORMATS:
            raise ConfigError(
                f"data.task_args.answer_format={answer_format!r} must be one of: "
                + ", ".join(ANSWER_FORMATS)
            )
        if not 0.0 < test_fraction < 1.0:
            raise ConfigError(f"data.task_args.test_fraction={test_fraction!r} must be in (0, 1)")
        if not isinstance(partial_credit, bool):
            raise ConfigError(f"data.task_args.partial_credit={partial_credit!r} must be a bool")
        self.seed, self.test_fraction, self.tags = seed, test_fraction, answer_format == "tags"
        self.partial_credit = partial_credit
        if instruction is None:
            instruction = TAGS_INSTRUCTION if self.tags else ""
        self.instruction = instruction
        self.data = _generator(rg, dataset, config, datasets, seed)
        self._drawn: dict[str, list[int]] = {split: [] for split in SPLITS}
        self._next = 0  # the first index of the stream not yet assigned to a split
        self._held: set[str] = set()  # questions already in the held-out split

    def examples(self, split: str, n: int) -> list[Example]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        drawn = self._drawn[split]
        budget = min(POOL, self._next + SCAN * max(n - len(drawn), 1))
        while len(drawn) < n:
            if self._next >= budget:
                raise ArdeaError(
                    f"reasoning-gym gave {len(drawn)} {split} examples of the {n} asked for "
                    f"in {self._next} entries: too few distinct questions under its config "
                    "(widen its difficulty ranges or ask for fewer)"
                )
            self._assign(self._next)
            self._next += 1
        return [self._example(i) for i in drawn[:n]]

    def _assign(self, index: int) -> None:
        question = self.data[index]["question"]
        if not self._held_out(question):
            self._drawn["train"].append(index)
        elif question not in self._held:  # the held-out split without repeats
            self._held.add(question)
            self._drawn["test"].append(index)

    def _held_out(self, question: str) -> bool:
        key = hashlib.blake2b(f"{self.seed}\0{question}".encode(), digest_size=8).digest()
        return int.from_bytes(key, "big") < self.test_fraction * 2**64

    def _example(self, index: int) -> Example:
        entry = self.data[index]
        question, answer = entry["question"].strip(), str(entry["answer"])
        prompt = f"{question}\n{self.instruction}" if self.instruction else question
        meta = {"index": index, "source": entry["metadata"].get("source_dataset", "")}
        demonstration = f"<answer>{answer}</answer>" if self.tags else None
        return Example(prompt, answer, meta, demonstration)

    def _answer(self, completion: str) -> str | None:
        if not self.tags:
            return completion.strip()
        from reasoning_gym.utils import extract_answer

        return extract_answer(completion, tag_name="answer", strip=True)

    def score(self, completion: str, example: Example) -> float:
        entry = self.data[example.meta["index"]]
        score = float(self.data.score_answer(self._answer(completion), entry))
        return score if self.partial_credit else float(score >= 1.0)

    def extract_answer(self, completion: str, example: Example) -> Hashable | None:
        answer = self._answer(completion)
        return answer or None


def _generator(rg, dataset, config, datasets, seed: int):
    """The reasoning-gym dataset of the task's arguments (one generator or a composite)."""
    if (dataset is None) == (datasets is None):
        raise ConfigError(
            "data.task=reasoning_gym needs data.task_args.dataset (one generator) or "
            "data.task_args.datasets (a weighted mix), and not both"
        )
    known = sorted(name for name in rg.factory.DATASETS if name != "composite")
    if dataset is not None:
        _check_name(dataset, known, "dataset")
        return _create(rg, dataset, config or {}, f"data.task_args.config of {dataset!r}",
                       size=POOL, seed=seed)  # fmt: skip
    if not isinstance(datasets, dict) or not datasets:
        raise ConfigError(
            "data.task_args.datasets must map generator names to {weight, config}, "
            f"got {datasets!r}"
        )
    if config is not None:
        raise ConfigError("data.task_args.config goes with dataset; with datasets give each "
                          "generator's config under its name")  # fmt: skip
    from reasoning_gym.composite import DatasetSpec

    specs = []
    for name, spec in datasets.items():
        _check_name(name, known, f"datasets.{name}")
        spec = dict(spec or {})
        unknown = sorted(set(spec) - {"weight", "config"})
        if unknown:
            raise ConfigError(f"data.task_args.datasets.{name}: unknown key(s) "
                              f"{', '.join(unknown)}; allowed: weight, config")  # fmt: skip
        weight = spec.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
            raise ConfigError(f"data.task_args.datasets.{name}.weight={weight!r} must be > 0")
        # each generator's config checked by creating it alone: the error names the key
        _create(rg, name, spec.get("config") or {}, f"data.task_args.datasets.{name}.config",
                size=1, seed=seed)  # fmt: skip
        specs.append(DatasetSpec(name=name, weight=float(weight), config=spec.get("config") or {}))
    return rg.create_dataset("composite", size=POOL, seed=seed, datasets=specs)


def _check_name(name: Any, known: list[str], where: str) -> None:
    if name not in known:
        raise ConfigError(
            f"data.task_args.{where}={name!r} is not a reasoning-gym generator; "
            f"the {len(known)} known: {', '.join(known)}"
        )


def _create(rg, name: str, config: dict[str, Any], where: str, **fixed: Any):
    if not isinstance(config, dict):
        raise ConfigError(f"{where} must be a mapping of the generator's settings, got {config!r}")
    clash = sorted(set(config) & {"seed", "size"})
    if clash:
        raise ConfigError(f"{where}: {', '.join(clash)} is set by ardea (data.seed, and "
                          "examples are drawn as needed)")  # fmt: skip
    fields = [f.name for f in dataclasses.fields(rg.factory.DATASETS[name][1])]
    unknown = sorted(set(config) - set(fields))
    if unknown:
        settings = ", ".join(f for f in fields if f not in ("seed", "size"))
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}; "
                          f"{name}'s settings: {settings}")  # fmt: skip
    try:
        return rg.create_dataset(name, **config, **fixed)
    except (TypeError, ValueError, AssertionError) as err:  # its own validation of the values
        raise ConfigError(f"{where}: {err}") from err
