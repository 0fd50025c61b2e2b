"""A mistake on the command line or in the config is answered before torch and transformers
are imported (those take seconds): each command below fails with status 2 in a fresh
interpreter that never imported torch."""

import subprocess
import sys

import pytest

PROBE = """
import sys
from ardea.cli.main import main
status = main(sys.argv[1:])
print("status", status, "torch imported", "torch" in sys.modules, "transformers imported",
      "transformers" in sys.modules)
"""

MISTAKES = [
    ["eval", "{missing}", "--k", "0"],
    ["eval", "{missing}", "--k", "2", "--num-samples", "1"],
    ["eval", "{missing}"],
    ["generate", "{missing}", "--prompt", "1+1="],
    ["serve", "{missing}"],
    ["serve", "{missing}", "--tinker"],
    ["serve", "{missing}", "--tinker", "rollout.engine=vllm"],
    ["serve", "{missing}", "--tinker", "--samplers", "0"],
    ["train", "trainer.max_step=3"],
    ["train", "model.dtype=float8"],
]


@pytest.mark.parametrize("argv", MISTAKES, ids=" ".join)
def test_a_mistake_is_answered_before_torch_is_imported(argv, tmp_path):
    argv = [a.format(missing=tmp_path / "missing") for a in argv]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60
    )
    assert "status 2 torch imported False transformers imported False" in done.stdout, (
        done.stdout + done.stderr
    )
    assert f"ardea {argv[0]}: error:" in done.stderr


def test_a_device_that_is_not_one_is_named(tmp_path, tokenizer, capsys):
    from ardea.cli.main import main
    from tests.tiny_models import small_model

    small_model(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert main(["serve", str(tmp_path), "--tinker", "--device", "gpu0"]) == 2
    assert "--device='gpu0': not a device" in capsys.readouterr().err
