"""Loading a local HF model directory: the happy path and one-line errors naming the path."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from ardea.model import ModelLoadError, build_char_tokenizer, load_model_and_tokenizer

from .conftest import random_ids


@pytest.fixture
def model_dir(tmp_path, tokenizer, small_policy):
    """A complete saved model + tokenizer directory."""
    path = tmp_path / "policy"
    small_policy.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def assert_one_line_naming(error: pytest.ExceptionInfo, path, fragment: str) -> None:
    message = str(error.value)
    assert "\n" not in message
    assert str(path) in message
    assert fragment in message


def test_loads_model_and_tokenizer(model_dir, tokenizer, small_policy):
    model, loaded_tokenizer = load_model_and_tokenizer(model_dir)
    assert not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    ids = random_ids(2, 9)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, small_policy(ids).logits)
    text = " 7 * 8 = 56\n\tdone  "
    assert loaded_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded_tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert loaded_tokenizer.pad_token_id == 0


def test_dtype_option(model_dir):
    model, _ = load_model_and_tokenizer(model_dir, dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    with pytest.raises(ValueError, match="unknown dtype 'fp8'; known: float32, bfloat16, float16"):
        load_model_and_tokenizer(model_dir, dtype="fp8")


def test_missing_directory(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ModelLoadError) as error:
        load_model_and_tokenizer(missing)
    assert_one_line_naming(error, missing, "does not exist")
    assert isinstance(error.value, ValueError)


def test_path_is_a_file(tmp_path):
    file = tmp_path / "weights.safetensors"
    file.write_text("x")
    with pytest.raises(ModelLoadError) as error:
        load_model_and_tokenizer(file)
    assert_one_line_naming(error, file, "is not a directory")


def test_missing_config(model_dir):
    (model_dir / "config.json").unlink()
    with pytest.raises(ModelLoadError) as error:
        load_model_and_tokenizer(model_dir)
    assert_one_line_naming(error, model_dir, "has no config.json")


def test_missing_weights(model_dir):
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError) as error:
        load_model_and_tokenizer(model_dir)
    assert_one_line_naming(error, model_dir, "has no weights")


def test_pickled_weights_are_refused(model_dir):
    (model_dir / "model.safetensors").unlink()
    (model_dir / "pytorch_model.bin").write_bytes(b"not even a pickle")
    with pytest.raises(ModelLoadError) as error:
        load_model_and_tokenizer(model_dir)
    assert_one_line_naming(error, model_dir, "pickled PyTorch weights")


def test_missing_tokenizer(model_dir):
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (model_dir / name).unlink()
    with pytest.raises(ModelLoadError) as error:
        load_model_and_tokenizer(model_dir)
    assert_one_line_naming(error, model_dir, "has no tokenizer")


def test_weights_missing_from_checkpoint(model_dir):
    state = load_file(str(model_dir / "model.safetensors"))
    del state["model.norm.weight"]
    save_file(state, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError) as error:
        load_model_and_tokenizer(model_dir)
    assert_one_line_naming(error, model_dir, "1 missing or mis-shaped tensors (model.norm.weight)")


def test_unknown_model_type(model_dir):
    save_file({"junk": torch.zeros(2)}, str(model_dir / "model.safetensors"))
    (model_dir / "config.json").write_text('{"model_type": "no_such_family"}')
    with pytest.raises(ModelLoadError) as error:
        load_model_and_tokenizer(model_dir)
    assert_one_line_naming(error, model_dir, "cannot load the model")


def test_tokenizer_without_pad_gets_eos(tmp_path, small_policy):
    tokenizer = build_char_tokenizer()
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    small_policy.config.pad_token_id = None
    small_policy.generation_config.pad_token_id = None
    small_policy.save_pretrained(tmp_path)
    model, loaded = load_model_and_tokenizer(tmp_path)
    assert loaded.pad_token == "<eos>"
    assert loaded.pad_token_id == 2
    assert model.config.pad_token_id == 2
    assert model.generation_config.pad_token_id == 2
