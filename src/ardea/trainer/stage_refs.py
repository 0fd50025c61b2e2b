"""References from one stage of a staged run to an earlier stage's final model.

A stage may name an earlier stage's final checkpoint where it names a model directory:
``model.path: stage:sft`` starts the stage from stage ``sft``'s final model (rather than the
previous stage's), a reward function's ``kwargs.path: stage:rm`` scores with stage ``rm``'s
final model (e.g. a reward model that stage trained), and ``algo.teacher.path: stage:rl``
distils from it::

    stages:
      sft: {algo: {name: sft}}
      rm:  {algo: {name: reward_model}}                 # starts from sft's policy
      rl:
        algo: {name: online_grpo}
        model: {path: "stage:sft"}                       # the SFT policy, not the RM
        reward: {functions: [{name: reward_model, kwargs: {path: "stage:rm"}}]}

A reference must name a stage that runs before the one that holds it; it is replaced by that
stage's final checkpoint directory (``<run dir>/<stage>/checkpoints/step_*/policy``) just
before the stage starts. Anything else is a :class:`~ardea.errors.ConfigError` at planning
time, before the first stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ardea.config import ArdeaConfig
from ardea.errors import ConfigError

PREFIX = "stage:"


@dataclass(frozen=True)
class StageReference:
    """``field`` (e.g. ``reward.functions[0].kwargs.path``) names stage ``stage``;
    ``function``: the reward function's index, or None for ``model.path`` and
    ``algo.teacher.path``."""

    field: str
    stage: str
    function: int | None = None


def _named(value: object) -> str | None:
    if isinstance(value, str) and value.startswith(PREFIX):
        return value[len(PREFIX) :]
    return None


def stage_references(config: ArdeaConfig) -> list[StageReference]:
    """The references a stage's config holds, in field order."""
    found = []
    if (name := _named(config.model.path)) is not None:
        found.append(StageReference("model.path", name))
    if (name := _named(config.algo.teacher.path)) is not None:
        found.append(StageReference("algo.teacher.path", name))
    for i, spec in enumerate(config.reward.functions):
        if (name := _named(dict(spec.kwargs).get("path"))) is not None:
            found.append(StageReference(f"reward.functions[{i}].kwargs.path", name, i))
    return found


def check_references(config: ArdeaConfig, earlier: list[str]) -> list[StageReference]:
    """The stage's references, each checked to name one of the ``earlier`` stages.

    Raises:
        ConfigError: naming the field, the value and the stages it could name.
    """
    references = stage_references(config)
    for ref in references:
        if ref.stage not in earlier:
            choices = ", ".join(earlier) if earlier else "none: this is the first stage"
            raise ConfigError(
                f"{ref.field}={PREFIX}{ref.stage!r} names no earlier stage (a stage can use "
                f"the final model of the stages before it: {choices})"
            )
    return references


def resolve_references(config: ArdeaConfig, checkpoints: dict[str, str]) -> None:
    """Replace every reference in ``config`` by the named stage's final checkpoint
    directory (``checkpoints``: stage name → directory), in place."""
    for ref in stage_references(config):
        path = checkpoints.get(ref.stage)
        if path is None:
            raise ConfigError(f"{ref.field}: stage {ref.stage!r} left no final checkpoint")
        if ref.field == "model.path":
            config.model.path = path
        elif ref.field == "algo.teacher.path":
            config.algo.teacher.path = path
        else:
            spec = config.reward.functions[ref.function]
            spec.kwargs = {**dict(spec.kwargs), "path": path}
