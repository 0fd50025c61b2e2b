"""The one interface the RL step drives rollouts through: :class:`Runner`.

:class:`~ardea.rollout.RolloutRunner` (G completions per prompt) and
:class:`~ardea.agent.EpisodeRunner` (G agent episodes per environment row) both implement
it, with the same seeding: a call's ``seed_index`` names its random stream and
``first_prompt`` places its examples in a rollout split over processes, so that each row
``first_prompt * G + i`` samples what it would if one process played the whole rollout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ardea.rollout.engine import GenerationEngine
from ardea.rollout.runner import Rollout


class Runner(Protocol):
    """Generates ``group_size`` rollouts per example on ``engine``, then scores them.

    ``generate`` returns an opaque generation (completions or played episodes) that
    ``score`` turns into a :class:`~ardea.rollout.Rollout`; the two are separate calls so the
    RL step can time them apart and a background worker can generate ahead. A worker passes
    ``score=True`` so that the reward functions run there, off the step's critical path
    (an :class:`~ardea.agent.EpisodeRunner` scores each episode as it is played anyway).
    ``generation_state`` / ``restore_generation`` store a generation in a checkpoint as
    plain lists and give it back for the examples the sampler yields again.
    """

    engine: GenerationEngine
    tokenizer: Any
    group_size: int

    def generate(
        self,
        examples: Sequence[Any],
        *,
        seed_index: Sequence[int] | int,
        engine: GenerationEngine | None = None,
        first_prompt: int = 0,
        score: bool = False,
    ) -> Any: ...

    def score(self, generation: Any) -> Rollout: ...

    def generation_state(self, generation: Any) -> dict[str, Any]: ...

    def restore_generation(self, state: dict[str, Any], examples: list[Any]) -> Any: ...

    def close(self) -> None:
        """Release what the runner holds for its lifetime (a server of its own)."""
        ...
