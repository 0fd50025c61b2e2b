"""ardea: post-training language models with reinforcement learning."""

__version__ = "0.1.0"
