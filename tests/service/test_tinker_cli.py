"""`ardea serve --tinker`'s engine and precision options: the engine's options are
``rollout.vllm``'s (a launched server unless urls name one), overrides of anything else are
refused, and the dtypes come from the flags, else the run's config, else ardea's defaults."""

import argparse

import pytest

from ardea.cli.serve import tinker_config
from ardea.errors import ArdeaError


def args(engine="in_process", *overrides, dtype=None, compute_dtype=None):
    return argparse.Namespace(engine=engine, args=list(overrides), dtype=dtype,
                              compute_dtype=compute_dtype)  # fmt: skip


def test_vllm_options_are_rollout_vllm_with_a_launched_server_by_default():
    options, dtype, compute = tinker_config(args("vllm", "rollout.vllm.timeout_s=7"), None)
    assert options["launch"] is True and options["urls"] == [] and options["timeout_s"] == 7.0
    assert (dtype, compute) == ("float32", "auto")  # ardea's model.dtype, model.compute_dtype
    options, _, _ = tinker_config(args("vllm", "rollout.vllm.urls=[http://127.0.0.1:1]"), None)
    assert options["launch"] is False and options["urls"] == ["http://127.0.0.1:1"]
    assert tinker_config(args(), None)[0] == {}


@pytest.mark.parametrize(("engine", "override", "message"), [
    ("in_process", "rollout.vllm.timeout_s=5", "rollout.vllm.\\* overrides \\(with --engine vllm\\)"),
    ("vllm", "trainer.lr=1", "and no others"),
    ("vllm", "rollout.vllm.sync_tolerance=-1", "sync_tolerance"),
    ("nope", None, "in_process, vllm"),
])  # fmt: skip
def test_wrong_options_are_named(engine, override, message):
    with pytest.raises(ArdeaError, match=message):
        tinker_config(args(engine, *([override] if override else [])), None)


def test_the_dtypes_are_the_flags_else_the_runs(tmp_path):
    run = tmp_path / "config.yaml"
    run.write_text("model:\n  dtype: bfloat16\n  compute_dtype: bfloat16\n")
    assert tinker_config(args(), run)[1:] == ("bfloat16", "bfloat16")
    assert tinker_config(args(compute_dtype="float16"), run)[1:] == ("bfloat16", "float16")
