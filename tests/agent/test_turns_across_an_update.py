"""An agent episode whose turns straddle a weight update: the turns before it carry the
old version and the old weights' log-probs, the turns after it the new ones; the trajectory
keeps each token's version (context tokens: -1), as partial rollouts need."""

from __future__ import annotations

import torch
from tiny_models import small_model

from ardea.agent.episodes import EpisodeRunner
from ardea.config import AgentConfig
from ardea.rollout import EngineSpec, SamplingParams, make_engine, own_copy
from tests.agent.agent_testing import UpdatingEnv


def test_turns_after_an_update_carry_the_new_version_and_its_logprobs(model, tokenizer):
    old = model
    new = small_model(tokenizer, seed=1, max_position_embeddings=512).float().eval()
    engine = make_engine("in_process", EngineSpec.of(old, tokenizer), module=own_copy(old))
    UpdatingEnv.UPDATE = lambda: engine.update_weights(new.state_dict(), 1)
    try:
        runner = EpisodeRunner(
            engine,
            tokenizer,
            AgentConfig(env="tests.agent.agent_testing.UpdatingEnv", max_turns=3),
            group_size=1,
            params=SamplingParams(temperature=1.0, max_new_tokens=5),
        )
        batch = runner.score(runner.generate([{"turns": 3}], seed_index=0)).batch
    finally:
        UpdatingEnv.UPDATE = None
    generated = batch.loss_mask[0].bool()
    turns, versions = batch.turn_ids[0][generated], batch.versions[0][generated]
    assert sorted(set(turns.tolist())) == [0, 1, 2]
    assert (versions == (turns > 0).long()).all()  # turn 0 before the update, 1 and 2 after
    assert (batch.versions[0][~generated] == -1).all()
    ids = batch.input_ids[:1, : int(batch.attention_mask[0].sum())]
    for version, weights in ((0, old), (1, new)):
        with torch.no_grad():
            logp = torch.log_softmax(weights(input_ids=ids).logits[0].float(), -1)
        at = (generated[: ids.shape[1]] & (batch.versions[0][: ids.shape[1]] == version)).nonzero()[
            :, 0
        ]
        expected = logp[at - 1].gather(-1, ids[0, at][:, None])[:, 0]
        assert (expected - batch.logprobs[0, at]).abs().max() <= 1e-5
