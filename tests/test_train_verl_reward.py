"""Where the reward lands, with verl 0.9.1's own code in the loop: `CudaAgentLoop`'s output for
every way an episode ends goes through verl's `AgentLoopWorker._agent_loop_postprocess` and
`_postprocess` (padding, masks, `rm_scores` on the last response token) and its
`compute_gae_advantage_return` (gamma = lambda = 1, zero values, as a fresh critic gives): the
return on every model token must be the episode's reward. verl drops a reward that sits on an
observation token (mask 0), so an episode that ended on observation tokens would train on 0.

Runs in verl's environment (.venv-verl; skipped where verl is not installed)."""

from __future__ import annotations

import pytest

from agent_server import RELU_TASK  # noqa: E402
from cuda_agent.tasks import Task
from train_fakes import FakeGate
from verl_fakes import LIST, SUBMIT, VERIFY, WRITE_GOOD, ScriptedServer, compose, need_verl, run_loop

PROMPT_LENGTH = 2048


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    need_verl()
    from cuda_agent.train.tiny import build_tiny

    path = tmp_path_factory.mktemp("tiny")
    _, tok = build_tiny(path)
    return path, tok


def _config(model, tmp_path, *, response_length: int, max_turns: int = 8, context_tokens: int = 16_384,
            repeat_limit: int = 6):
    return compose("ppo_trainer", [
        f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}",
        f"data.max_prompt_length={PROMPT_LENGTH}", f"data.max_response_length={response_length}",
        "data.train_files=/unused.parquet", "data.val_files=/unused.parquet",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async",
        "+cuda_agent.judge.device=cpu", f"+cuda_agent.workdir={tmp_path}",
        f"+cuda_agent.episodes_dir={tmp_path / 'episodes'}",
        f"+cuda_agent.episode.max_turns={max_turns}", f"+cuda_agent.episode.context_tokens={context_tokens}",
        "+cuda_agent.episode.turn_tokens=512", "+cuda_agent.episode.repeat_warn=2",
        f"+cuda_agent.episode.repeat_limit={repeat_limit}", "+cuda_agent.concurrency=2"])


def _verl_returns(config, out, *others):
    """`out` (in a batch with `others`) through verl's worker postprocessing and GAE: its
    (returns, response_mask, rm_scores)."""
    import asyncio

    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    worker = AgentLoopWorker(config, llm_client=None)
    internal = [asyncio.run(worker._agent_loop_postprocess(o, validate=False, raw_prompt=[])) for o in (out, *others)]
    batch = worker._postprocess(internal).batch
    scores, mask = batch["rm_scores"], batch["response_mask"]
    _, returns = compute_gae_advantage_return(scores, torch.zeros_like(scores), mask, gamma=1.0, lam=1.0)
    return returns[0], mask[0], scores[0]


def _episode(tiny, tmp_path, replies, **settings):
    model, tok = tiny
    config = _config(model, tmp_path, **settings)
    out = run_loop(config, tok, ScriptedServer(tok, replies), Task.from_source(RELU_TASK, name="relu"), FakeGate())
    return config, out


def _check(config, out, *, termination: str, reward: float):
    info = out.extra_fields["reward_extra_info"]
    assert info["termination"] == termination, info
    assert out.reward_score == reward
    assert len(out.response_ids) <= config.actor_rollout_ref.rollout.response_length   # as verl counts it
    assert out.response_mask[-1] == 1, "the episode must end on a model token"
    returns, mask, scores = _verl_returns(config, out)
    n = len(out.response_ids)
    assert mask[:n].tolist() == out.response_mask and scores.nonzero().flatten().tolist() == [n - 1]
    model = mask.bool()
    assert model.sum() > 0 and returns[model].allclose(returns.new_full((int(model.sum()),), reward)), \
        f"returns on model tokens {returns[model].unique().tolist()}, reward {reward}"


def test_submitted(tiny, tmp_path):
    config, out = _episode(tiny, tmp_path, [WRITE_GOOD, SUBMIT], response_length=4096)
    _check(config, out, termination="submitted", reward=2.0)


def test_max_turns_after_a_tool_result(tiny, tmp_path):
    # the limit is checked after the last turn's tools ran: their result is never rendered
    config, out = _episode(tiny, tmp_path, [WRITE_GOOD, VERIFY], response_length=4096, max_turns=2)
    _check(config, out, termination="max_turns", reward=2.0)


def _two_turns(tiny, tmp_path) -> tuple[int, int]:
    """(prompt, response) token counts of WRITE_GOOD, VERIFY: the budgets below end the episode
    right after them."""
    _, out = _episode(tiny, tmp_path / "probe", [WRITE_GOOD, VERIFY], response_length=4096, max_turns=2)
    return len(out.prompt_ids), len(out.response_ids)


def test_context_budget(tiny, tmp_path):
    prompt, response = _two_turns(tiny, tmp_path)
    # the verify result does not fit with room for one more model token
    config, out = _episode(tiny, tmp_path, [WRITE_GOOD, VERIFY, LIST], response_length=4096,
                           context_tokens=prompt + response + 3)
    _check(config, out, termination="context_exhausted", reward=2.0)


def test_response_length_cuts_a_turn(tiny, tmp_path):
    _, response = _two_turns(tiny, tmp_path)
    # room for the verify result and a few tokens of the next turn, which is cut at verl's
    # response_length; its call-less reply's observation then does not fit
    probe_config, probe = _episode(tiny, tmp_path / "obs", [WRITE_GOOD, VERIFY, LIST], response_length=4096,
                                   max_turns=3)
    observation = len(probe.response_ids) - response - sum(probe.response_mask[response:])
    length = response + observation + 6
    config, out = _episode(tiny, tmp_path, [WRITE_GOOD, VERIFY, "I will now think at length " * 20],
                           response_length=length)
    assert len(out.response_ids) == length and sum(out.response_mask[-6:]) == 6
    _check(config, out, termination="context_exhausted", reward=2.0)


def test_repetition(tiny, tmp_path):
    config, out = _episode(tiny, tmp_path, [WRITE_GOOD, VERIFY, LIST, LIST, LIST], response_length=4096,
                           repeat_limit=3)
    _check(config, out, termination="repeated", reward=2.0)


def test_an_error_keeps_the_judged_reward(tiny, tmp_path):
    config, out = _episode(tiny, tmp_path, [WRITE_GOOD, VERIFY, RuntimeError("the server went away")],
                           response_length=4096)
    assert out.extra_fields["reward_extra_info"]["termination"] not in ("submitted", "max_turns", "repeated")
    _check(config, out, termination=out.extra_fields["reward_extra_info"]["termination"], reward=2.0)


def test_nothing_judged_gets_the_fail_reward_on_model_tokens(tiny, tmp_path):
    config, out = _episode(tiny, tmp_path, [LIST], response_length=4096, max_turns=1)
    assert out.reward_score < 0
    _check(config, out, termination="max_turns", reward=out.reward_score)


def test_the_episodes_folder_must_be_absolute_and_writable(tmp_path):
    need_verl()
    from cuda_agent.train.verl_loop import check_episodes_dir

    assert check_episodes_dir(tmp_path / "eps") == tmp_path / "eps" and (tmp_path / "eps").is_dir()
    with pytest.raises(ValueError, match="absolute"):
        check_episodes_dir("episodes")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="not writable"):   # a file where a folder should be (root ignores modes)
        check_episodes_dir(tmp_path / "file" / "eps")


def test_an_error_before_any_model_token_gives_verl_an_empty_response(tiny, tmp_path):
    # nothing was sampled: verl pads an empty response and GAE has no model token to train
    config, out = _episode(tiny, tmp_path, [RuntimeError("the server went away")], response_length=4096)
    assert out.response_ids == [] and out.response_mask == []
    _, other = _episode(tiny, tmp_path / "other", [WRITE_GOOD, SUBMIT], response_length=4096)
    returns, mask, _ = _verl_returns(config, out, other)   # a batch of one without model tokens cannot whiten
    assert int(mask.sum()) == 0 and returns.abs().sum() == 0
