"""The rollout service and what it drives: the service that owns generation
(:mod:`~ardea.trainer.rollouts.service`), the runner a run's config picks
(:mod:`~ardea.trainer.rollouts.runners`), agent runs (:mod:`~ardea.trainer.rollouts.agent_runs`)
and DAPO's dynamic sampling (:mod:`~ardea.trainer.rollouts.dynamic_sampling`)."""
