"""The Tinker API driven by the real ``tinker`` SDK (0.38.0) against an in-process server.

References are computed independently of the server: the base model loaded with
transformers, the same LoRA layout applied with peft under the same seed, ardea's own SFT
loss (``masked_cross_entropy``, summed) and ``torch.optim.AdamW``; sampled log-probs
against a teacher-forced forward of the saved sampler weights and against ardea's engine.
"""

import math

import numpy as np
import pytest
import tinker
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from tinker import types
from transformers import AutoModelForCausalLM

from ardea.algo import Aggregation, masked_cross_entropy
from ardea.rollout.engine import stop_token_ids
from ardea.rollout.engines.inprocess.engine import InProcessEngine
from ardea.rollout.sampling_params import SamplingParams
from ardea.service.tinker_server import TinkerServer
from tests.tiny_models import small_model

RANK, SEED = 4, 7
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tinker") / "tiny"
    small_model(tokenizer, seed=3, max_position_embeddings=128).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(base_dir, tmp_path_factory):
    with TinkerServer({"tiny": base_dir}, state_dir=tmp_path_factory.mktemp("state")) as running:
        yield running


@pytest.fixture(scope="module")
def service(server, monkeypatch_module):
    with tinker.ServiceClient(base_url=server.url, api_key="tml-test") as client:
        yield client  # leaving the block finishes the session: no heartbeats left behind


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINKER_TELEMETRY", "0")
        yield patch


def batch(tokenizer, texts=("12+30=42", "7+8=15;;", "99+1=100")):
    """Datums of equal length (no padding, so the reference batch is the same tensor)."""
    data, rows = [], []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        weights = [0.0] * 3 + [1.0] * (len(ids) - 4)
        data.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                                loss_fn_inputs={"target_tokens": ids[1:], "weights": weights}))  # fmt: skip
        rows.append((ids, weights))
    return data, rows


def reference_model(base_dir):
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(SEED)
    config = LoraConfig(r=RANK, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS)
    return get_peft_model(base, config)


def adapter(server, path):
    directory = server.service.store.directory(server.service.store.existing(path)[0])
    return load_file(directory / "adapter" / "adapter_model.safetensors")


def test_sft_steps_equal_ardea_loss_and_adamw(service, server, base_dir, tokenizer):
    """Three forward_backward + optim_step rounds: the losses fall, and loss, log-probs
    and the adapters after the steps equal the reference's."""
    trainer = service.create_lora_training_client(base_model="tiny", rank=RANK, seed=SEED).result()
    data, rows = batch(tokenizer)
    # eps 1e-4 keeps Adam's step Lipschitz in the gradient (|d step / d g| <= lr / eps = 100):
    # the server and the reference sum in other orders (a mask or none, ~1e-8 apart on these
    # gradients), which a tiny eps would turn into lr-sized sign flips of near-zero entries;
    # 100 x 1e-8 per step over three steps stays far inside atol 1e-5
    adam = types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-4,
                            weight_decay=0.01)  # fmt: skip
    ref = reference_model(base_dir)
    optimizer = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-2,
                                  betas=(0.9, 0.95), eps=1e-4, weight_decay=0.01)  # fmt: skip
    ids = torch.tensor([r[0] for r in rows])
    mask = torch.tensor([r[1] for r in rows]).bool()
    losses = []
    for _ in range(3):
        out = trainer.forward_backward(data, "cross_entropy").result()
        trainer.optim_step(adam).result()
        logits = ref(input_ids=ids[:, :-1]).logits
        loss, _ = masked_cross_entropy(logits, ids[:, 1:], mask,
                                       agg=Aggregation("seq-mean-token-sum", seqs=1))  # fmt: skip
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        assert out.metrics["loss:sum"] == pytest.approx(loss.item(), rel=1e-5)
        got = torch.log_softmax(logits.detach(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        for i, output in enumerate(out.loss_fn_outputs):
            np.testing.assert_allclose(output["logprobs"].to_numpy(), got[i].numpy(), atol=1e-5)
        losses.append(out.metrics["loss:sum"])
    assert losses[0] > losses[1] > losses[2]
    saved = adapter(server, trainer.save_state("after3").result().path)
    theirs = {k.replace(".default", ""): v for k, v in ref.state_dict().items() if "lora_" in k}
    for name, value in saved.items():
        if "lora_" in name:
            torch.testing.assert_close(value, theirs[name], rtol=0, atol=1e-5)


def test_save_and_load_state_resume_bit_exactly(service, server, tokenizer):
    data, _ = batch(tokenizer)
    adam = types.AdamParams(learning_rate=5e-3)
    first = service.create_lora_training_client(base_model="tiny", rank=RANK, seed=1).result()
    for _ in range(2):
        first.forward_backward(data, "cross_entropy")
        first.optim_step(adam).result()
    state = first.save_state("two").result().path
    expected_loss = first.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    first.optim_step(adam).result()
    expected = adapter(server, first.save_state("three").result().path)

    resumed = service.create_training_client_from_state_with_optimizer(state).result()
    loss = resumed.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    resumed.optim_step(adam).result()
    got = adapter(server, resumed.save_state("three").result().path)
    assert loss == expected_loss
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in got)

    fresh_adam = service.create_training_client_from_state(state).result()  # no optimizer
    fresh_adam.forward_backward(data, "cross_entropy")
    fresh_adam.optim_step(adam).result()
    other = adapter(server, fresh_adam.save_state("three").result().path)
    assert not all(torch.equal(other[k], expected[k]) for k in other)


def test_a_custom_loss_takes_the_same_step_as_the_built_in_one(service, server, tokenizer):
    """forward_backward_custom runs in the SDK as a forward and a cross_entropy request with
    ``-dL/dlogprobs`` as weights: with L the weighted NLL it must move the adapters exactly
    as forward_backward("cross_entropy") does, and report L as loss:sum."""
    data, rows = batch(tokenizer)
    adam = types.AdamParams(learning_rate=1e-2)

    def weighted_nll(batch_data, logprobs):
        loss = sum((-lp * torch.tensor(d.loss_fn_inputs["weights"].data)).sum()
                   for d, lp in zip(batch_data, logprobs))  # fmt: skip
        return loss, {"nll": float(loss.detach())}

    saved = {}
    for name in ("custom", "built_in"):
        trainer = service.create_lora_training_client(base_model="tiny", rank=RANK, seed=9).result()
        if name == "custom":
            out = trainer.forward_backward_custom(data, weighted_nll).result()
        else:
            out = trainer.forward_backward(data, "cross_entropy").result()
        trainer.optim_step(adam).result()
        saved[name] = (
            out.metrics["loss:sum"],
            adapter(server, trainer.save_state(name).result().path),
        )
    # the custom loss sums ~20 float32 terms client-side, in another order than the server:
    # ~20 x 6e-8 relative at most
    assert saved["custom"][0] == pytest.approx(saved["built_in"][0], rel=1e-5)
    # -d(sum -lp w)/dlp = w exactly: the same weights reach the server, the same gradient
    for key, value in saved["built_in"][1].items():
        torch.testing.assert_close(saved["custom"][1][key], value, rtol=0, atol=0)


def teacher_forced(model, prompt, tokens):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
    return logp.gather(-1, ids[0, 1:, None])[:, 0].tolist()


def test_sampling_matches_the_engine_and_a_forward(service, server, tokenizer):
    trainer = service.create_lora_training_client(base_model="tiny", rank=RANK, seed=2).result()
    data, _ = batch(tokenizer)
    trainer.forward_backward(data, "cross_entropy")
    trainer.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    path = trainer.save_weights_for_sampler("s1").result().path
    sampler = service.create_sampling_client(model_path=path).result()
    assert sampler.get_tokenizer().encode("12+3") == tokenizer.encode("12+3")  # a local dir
    prompt = tokenizer.encode("12+3", add_special_tokens=False)
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=11)
    result = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result()

    directory = server.service.store.directory(server.service.store.existing(path)[0])
    merged = AutoModelForCausalLM.from_pretrained(directory / "policy").eval()
    engine = InProcessEngine(merged, pad_token_id=tokenizer.pad_token_id,
                             eos_token_ids=stop_token_ids(merged, tokenizer))  # fmt: skip
    ours = engine.generate([prompt], SamplingParams(max_new_tokens=6, seed=11, n=3))
    engine.close()
    for seq, completion in zip(result.sequences, ours):
        assert seq.tokens == completion.token_ids
        np.testing.assert_allclose(seq.logprobs, completion.logprobs, atol=1e-6)
        np.testing.assert_allclose(seq.logprobs, teacher_forced(merged, prompt, seq.tokens)[-len(seq.tokens):],
                                   atol=1e-5)  # fmt: skip
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
    assert scored[0] is None
    np.testing.assert_allclose(
        scored[1:], teacher_forced(merged, prompt[:1], prompt[1:]), atol=1e-5
    )


def test_stop_tokens_end_a_sample_and_are_returned(service, tokenizer):
    sampler = service.create_sampling_client(base_model="tiny").result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("4+4", add_special_tokens=False))
    greedy = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=6, temperature=0)).result()
    tokens = greedy.sequences[0].tokens
    stop = next(t for i, t in enumerate(tokens) if t not in tokens[:i] and i >= 1)
    cut = tokens[: tokens.index(stop) + 1]
    stopped = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=6, temperature=0,
                                                              stop=[stop])).result()  # fmt: skip
    assert stopped.sequences[0].tokens == cut
    assert stopped.sequences[0].stop_reason == "stop"
    assert greedy.sequences[0].stop_reason == "length"


def test_each_loss_reports_its_hand_formula(service, tokenizer):
    """forward (no update) with each RL loss: ``loss:sum`` is the formula on the returned
    log-probs, and two forwards in a row return the same numbers (nothing was trained)."""
    trainer = service.create_lora_training_client(base_model="tiny", rank=RANK, seed=3).result()
    ids = tokenizer.encode("3+4=7;", add_special_tokens=False)
    q = np.linspace(-3.0, -1.0, len(ids) - 1).astype(np.float32)
    adv = np.where(np.arange(len(ids) - 1) % 2 == 0, 1.0, -0.5).astype(np.float32)
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={
        "target_tokens": ids[1:], "logprobs": q.tolist(), "advantages": adv.tolist()})  # fmt: skip
    in_ratio = np.arange(len(ids) - 1) >= 2  # gspo: the first two positions not in the ratio

    def gspo(lp, r):  # the sequence ratio s over in_ratio; every token -min(s A, clip(s) A)
        s = np.exp(np.log(r)[in_ratio].mean())
        return -np.minimum(s * adv, np.clip(s, 0.8, 1.1) * adv)

    formulas = {
        "importance_sampling": ({}, lambda lp, r: -(r * adv)),
        "ppo": ({}, lambda lp, r: -np.minimum(r * adv, np.clip(r, 0.8, 1.2) * adv)),
        "cispo": ({"clip_low_threshold": 0.5}, lambda lp, r: -np.clip(r, 0.5, 1.2) * lp * adv),
        "gspo": ({"clip_high_threshold": 1.1}, gspo),
        "dro": ({"beta": 0.3}, lambda lp, r: -(lp * adv - 0.15 * (lp - q) ** 2)),
    }
    masked = types.Datum(model_input=datum.model_input, loss_fn_inputs={
        **datum.loss_fn_inputs, "sequence_ratio_mask": in_ratio.astype(np.float32).tolist()})  # fmt: skip
    for name, (config, formula) in formulas.items():
        out = trainer.forward([masked if name == "gspo" else datum], name, config or None).result()
        lp = out.loss_fn_outputs[0]["logprobs"].to_numpy().astype(np.float64)
        expected = formula(lp, np.exp(lp - q)).sum()
        assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5, abs=1e-6), name
    again = trainer.forward([datum], "dro", {"beta": 0.3}).result()
    assert again.metrics["loss:sum"] == pytest.approx(out.metrics["loss:sum"], abs=0)


def test_bad_requests_are_named_and_lose_nothing(service, server, tokenizer):
    with pytest.raises(tinker.BadRequestError, match="unknown base_model 'nope'"):
        service.create_lora_training_client(base_model="nope", rank=RANK).result()
    trainer = service.create_lora_training_client(base_model="tiny", rank=RANK, seed=4).result()
    before = adapter(server, trainer.save_state("before").result().path)
    data, _ = batch(tokenizer)
    short = types.Datum(model_input=data[0].model_input, loss_fn_inputs={
        "target_tokens": data[0].loss_fn_inputs["target_tokens"], "weights": [1.0, 1.0]})  # fmt: skip
    outside = types.Datum(model_input=types.ModelInput.from_ints([1, 10**6]),
                          loss_fn_inputs={"target_tokens": [1, 2], "weights": [1.0, 1.0]})  # fmt: skip
    failures = [
        (lambda: trainer.forward_backward(data, "stable_reinforce"),
         "loss_fn 'stable_reinforce' is not served"),
        (lambda: trainer.forward_backward([short], "cross_entropy"), r"\['weights'\] has shape \[2\]"),
        (lambda: trainer.forward_backward([outside], "cross_entropy"), "token ids outside"),
        (lambda: trainer.forward_backward(data, "importance_sampling"), "has no 'logprobs'"),
        (lambda: trainer.forward_backward(data, "cross_entropy", {"beta": 1.0}), "mean nothing"),
    ]  # fmt: skip
    for request, message in failures:  # checked whole before queueing: refused at once
        with pytest.raises(tinker.BadRequestError, match=message):
            request().result()
    trainer.optim_step(types.AdamParams(learning_rate=1.0)).result()  # no gradient: no change
    after = adapter(server, trainer.save_state("after").result().path)
    assert all(torch.equal(before[k], after[k]) for k in before)
    out = trainer.forward_backward(data, "cross_entropy").result()  # the model still trains
    assert math.isfinite(out.metrics["loss:sum"])

    sampler = service.create_sampling_client(base_model="tiny").result()
    prompt = types.ModelInput.from_ints([5, 6])
    with pytest.raises(tinker.BadRequestError, match="stop=\\[\\]"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2, stop=[])).result()
    with pytest.raises(tinker.BadRequestError, match="max_tokens=500 does not fit"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=500)).result()
    with pytest.raises(tinker.BadRequestError, match="no saved weights"):
        service.create_sampling_client(
            model_path=f"tinker://{trainer.model_id}/sampler_weights/x"
        ).result()


def test_the_rest_api_lists_and_deletes_checkpoints(service, server):
    trainer = service.create_lora_training_client(base_model="tiny", rank=RANK, seed=5,
                                                  user_metadata={"renderer_name": "role_colon"}).result()  # fmt: skip
    state = trainer.save_state("kept").result().path
    trainer.save_weights_for_sampler("kept").result()
    rest = tinker.RestClient(base_url=server.url, api_key="tml-test")
    listed = rest.list_checkpoints(trainer.model_id).result().checkpoints
    assert sorted(c.checkpoint_id for c in listed) == ["sampler_weights/kept", "weights/kept"]
    run = rest.get_training_run_by_tinker_path(state).result()
    assert (run.base_model, run.lora_rank, run.user_metadata) == ("tiny", RANK,
                                                                  {"renderer_name": "role_colon"})  # fmt: skip
    rest.delete_checkpoint_from_tinker_path(state).result()
    listed = rest.list_checkpoints(trainer.model_id).result().checkpoints
    assert [c.checkpoint_id for c in listed] == ["sampler_weights/kept"]


def test_a_retried_creation_gets_the_first_answer(server):
    """The SDK resubmits a create_model whose reply it lost: the same request, not a second
    model (one future, one registration)."""
    body = {"session_id": "retry", "model_seq_id": 0, "base_model": "tiny",
            "lora_config": {"rank": 2}}  # fmt: skip
    first = server.service.create_model(body)
    assert server.service.create_model(body) == first
    assert server.service.futures.get(first["request_id"]).result(60)["model_id"] == "retry:train:0"


def test_sampler_weights_saved_again_under_a_name_are_the_new_ones(service, tokenizer):
    """save_weights_for_sampler("same") after a step replaces the weights a sampling client
    of that path gets (a sampler built on the earlier ones is not reused): its prompt
    log-probs are those of the same weights saved under a new name."""
    trainer = service.create_lora_training_client(base_model="tiny", rank=RANK, seed=6).result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("12+3", add_special_tokens=False))

    def scores(name):
        path = trainer.save_weights_for_sampler(name).result().path
        return service.create_sampling_client(model_path=path).compute_logprobs(prompt).result()

    first = scores("same")
    data, _ = batch(tokenizer)
    trainer.forward_backward(data, "cross_entropy")
    trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    again, fresh = scores("same"), scores("fresh")
    assert again == fresh and again != first
