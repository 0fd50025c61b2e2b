"""The tests' small model in one place: a 2-layer, width-32 tiny Qwen2 on the character
tokenizer, as keyword arguments of :func:`ardea.model.build_tiny_model`, as command-line
overrides of a run, and built."""

from ardea.model import build_char_tokenizer, build_tiny_model

SMALL = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
#: the same model as ``model.*`` overrides of a run's config
SMALL_OVERRIDES = [f"model.{key}={value}" for key, value in SMALL.items()]
#: one layer, intermediate size 32: for runs that only need a model to exist
SMALLEST_OVERRIDES = [
    *SMALL_OVERRIDES[:1], "model.num_layers=1", *SMALL_OVERRIDES[2:4], "model.intermediate_size=32",
]  # fmt: skip


def small_model(tokenizer=None, *, seed: int = 0, **changes):
    """The small model (``changes`` override its sizes, ``arch``, positions) in float32."""
    tokenizer = tokenizer if tokenizer is not None else build_char_tokenizer()
    return build_tiny_model(tokenizer, **{**SMALL, **changes}, seed=seed)


def smallest_model(tokenizer=None, *, seed: int = 0):
    """The model of :data:`SMALLEST_OVERRIDES`, in float32."""
    return small_model(tokenizer, seed=seed, num_layers=1, intermediate_size=32)
