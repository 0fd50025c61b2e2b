"""Bad input through the real CLI: non-zero exit, one line naming the problem, no traceback."""

import pytest
from cli_testing import run_cli

# each case starts the real command in a fresh interpreter (5-10 s with its imports): the
# whole suite runs them, the edit-test loop (make test-fast) leaves them out
pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "trainer.foo=1"], "unknown config key 'trainer.foo'"),
        (["train", "trainer.max_steps=abc"], "trainer.max_steps"),
        (["train", "model.path=/nonexistent/model"], "/nonexistent/model"),
        (["train", "data.task=nope"], "unknown task data.task='nope'"),
        (["train", "missing.yaml"], "config file not found: missing.yaml"),
        (["eval", "/nonexistent/run"], "no such directory: /nonexistent/run"),
        (["eval", "/nonexistent/run", "--k", "0"], "--k 0: pass@k needs k >= 1"),
        (["eval", "/nonexistent/run", "--k", "4", "--num-samples", "2"], "--num-samples 2"),
        (["serve", "/nonexistent/model"], "no such directory: /nonexistent/model"),
        (["serve", "/nonexistent/model", "--port", "-1"], "--port -1"),
    ],
)
def test_bad_input_is_one_clear_line(args, needle, tmp_path):
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "holds no records"),
        (b'{"prompt": "1+1=", "completion": "2"}\n{"prompt": "2+2="}\n', "line 2"),
        (b'{"prompt": "1+1=", "completion": "2"}\n\xff\xfe\n', "line 2 is not valid UTF-8"),
        (b'{"prompt": "' + b"9" * 400 + b'=", "completion": "2"}\n', "max_length=256"),
    ],
    ids=["empty", "missing-field", "non-utf8", "too-long"],
)
def test_bad_dataset_is_one_clear_line(content, needle, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_bytes(content)
    result = run_cli(
        "train", "--recipe", "none", "data.task=null", f"data.path={data}", cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(data) in lines[0] and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_print_config_shows_overrides(tmp_path):
    result = run_cli("train", "--print-config", "trainer.max_steps=12", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "max_steps: 12" in result.stdout
    assert "task: arithmetic" in result.stdout


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        ('{"question": "1+1=", "answer": "2"}', "a 'prompt' sample needs the fields {'prompt'}"),
        ('{"prompt": 7, "answer": "2"}', "field 'prompt' must be a string or a list of messages"),
    ],
)
def test_bad_prompt_record_is_one_clear_line(record, needle, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n' + record + "\n")
    config = tmp_path / "grpo.yaml"
    config.write_text(
        f"algo: {{name: online_grpo}}\ndata: {{task: null, path: {data}}}\n"
        "reward: {functions: [{name: exact_match}]}\n"
    )
    result = run_cli("train", str(config), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{data} line 2: {needle}" in lines[0], result.stderr


def test_eval_without_a_task_is_one_clear_line(tmp_path):
    from ardea.model import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                     intermediate_size=16).save_pretrained(tmp_path / "model")  # fmt: skip
    tokenizer.save_pretrained(tmp_path / "model")
    overrides = ["data.task=null", "data.path=prompts.jsonl"]  # as in a run on a prompt file
    result = run_cli("eval", str(tmp_path / "model"), *overrides, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "has data.task=null; name one" in lines[0], result.stderr
