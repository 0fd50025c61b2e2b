"""Frozen models that score a step's tokens behind one seam: the
:class:`~ardea.trainer.scorers.token_scorer.TokenScorer` (``token_scorer``: a model in this
process or a vLLM server's prompt log-probs), the reference and the distillation teacher
(``teacher``), built and pinned together (``frozen``)."""

from ardea.trainer.scorers.frozen import FrozenScorers, build_scorers
from ardea.trainer.scorers.teacher import Teacher, check_teacher
from ardea.trainer.scorers.token_scorer import ServedTokenScorer, TokenScorer

__all__ = [
    "FrozenScorers",
    "ServedTokenScorer",
    "Teacher",
    "TokenScorer",
    "build_scorers",
    "check_teacher",
]
