"""The training step: the online RL step read top to bottom (:mod:`~ardea.trainer.step.rl_step`),
the updater that owns the trained components (:mod:`~ardea.trainer.step.updates`), and a
step's split into updates, micro-batches and rank shares (:mod:`~ardea.trainer.step.split`)."""
