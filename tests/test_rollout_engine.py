"""The episode engine with the token front: every ending ends on a model token, the response
budget bounds an episode without cutting it, sessions reach the policy, the repetition warning
reaches the model, and the reward the model reads is the reward it is trained on. Scripted
replies, a scripted judge, the tiny model's tokenizer (no compiler: fast tier)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from agent_server import RELU_TASK  # noqa: E402
from cuda_agent.agent.tools import Toolbox  # noqa: E402
from cuda_agent.agent.workspace import create_workspace  # noqa: E402
from cuda_agent.reward import RewardConfig  # noqa: E402
from cuda_agent.rollout.engine import Engine, EngineConfig  # noqa: E402
from cuda_agent.rollout.env import StepResult  # noqa: E402
from cuda_agent.rollout.outcome import JudgeFailure  # noqa: E402
from cuda_agent.rollout.tokens import TokenFront, TokenLimits  # noqa: E402
from cuda_agent.tasks import Task  # noqa: E402
from cuda_agent.train.episode import ChatRenderer, EpisodeConfig, run_agentic_episode  # noqa: E402
from cuda_agent.train.tiny import build_tokenizer  # noqa: E402

from train_fakes import FakeGate, ScriptedPolicy, verdict  # noqa: E402

GOOD = "# GOOD\nclass ModelNew: pass\n"


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(build_tokenizer())


@pytest.fixture
def task() -> Task:
    return Task.from_source(RELU_TASK, name="relu")


def call(name: str, **args) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


class Wrapped:
    """A Toolbox with one change: `truncate_after` steps end the episode (the environment's own
    limit), or `fail_after` steps make the judge unable to work."""

    def __init__(self, box: Toolbox, *, truncate_after: int | None = None, fail_after: int | None = None):
        self.box, self.truncate_after, self.fail_after, self.steps = box, truncate_after, fail_after, 0

    def reset(self):
        return self.box.reset()

    def step(self, call):
        self.steps += 1
        if self.fail_after is not None and self.steps > self.fail_after:
            raise JudgeFailure("no device")
        res = self.box.step(call)
        if self.truncate_after is not None and self.steps >= self.truncate_after:
            res.truncated = True
        return res

    def close(self):
        self.box.close()


def run(tmp_path, task, renderer, replies, *, reward=None, wrap=None, **cfg):
    box = Toolbox(task, create_workspace(task, tmp_path / "ws", "cpu"), FakeGate(), reward=reward)
    env = wrap(box) if wrap else box
    policy = ScriptedPolicy(renderer, replies)
    try:
        ep = run_agentic_episode(task, env, policy, renderer, EpisodeConfig(**{"turn_tokens": 4096, **cfg}),
                                 episode_id="ep-1")
    finally:
        box.close()
    return ep, policy


def prompt_tokens(tmp_path, task, renderer) -> int:
    from cuda_agent.rollout.prompts import agentic_messages

    box = Toolbox(task, create_workspace(task, tmp_path / "probe", "cpu"), FakeGate())
    return len(renderer.prompt_ids(agentic_messages(task, "cpu"), box.reset().tools))


def model_tokens_whole(ep, policy) -> bool:
    """Every generation is in the sequence whole, in order: nothing was cut afterwards."""
    return [t for t, m in zip(ep.response_ids, ep.response_mask) if m == 1] == \
        [t for g in policy.generations for t in g.token_ids]


ENDINGS = {
    "submitted": (["I start.", call("write_file", path="model_new.py", content=GOOD), call("submit")], {}),
    "max_turns": ([call("list_files"), call("read_file", path="model.py")], {"max_turns": 2}),
    "repeated": ([call("list_files")] * 8, {"repeat_limit": 3}),
    "environment": ([call("list_files")] * 4, {"wrap": lambda box: Wrapped(box, truncate_after=2)}),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_every_ending_ends_on_a_model_token(tmp_path, task, renderer, ending):
    replies, cfg = ENDINGS[ending]
    ep, policy = run(tmp_path, task, renderer, replies, **cfg)
    assert ep.termination == ending
    assert ep.response_mask[-1] == 1 and ep.response_ids[-1] == policy.generations[-1].token_ids[-1]
    assert model_tokens_whole(ep, policy)
    # the last turn's observation is in the conversation (it happened) but not in the tokens
    assert ep.messages[-1]["role"] == "tool"


def test_the_context_budget_ends_on_a_model_token(tmp_path, task, renderer):
    budget = prompt_tokens(tmp_path, task, renderer) + 60
    ep, policy = run(tmp_path, task, renderer, [call("list_files")] * 5, context_tokens=budget)
    assert ep.termination == "context_exhausted" and ep.response_mask[-1] == 1
    assert len(ep.prompt_ids) + len(ep.response_ids) <= budget and model_tokens_whole(ep, policy)


def test_the_response_budget_bounds_the_response_without_cutting_it(tmp_path, task, renderer):
    replies = [call("read_file", path="model.py"), call("list_files"), call("read_file", path="SKILL.md")]
    free, free_policy = run(tmp_path / "free", task, renderer, replies, max_turns=3)
    assert free.termination == "max_turns"
    # room for the first two turns whole, not for the second observation: the budget ends it there
    second_end = [i for i in range(1, len(free.response_mask))
                  if free.response_mask[i - 1] == 1 and free.response_mask[i] == 0][1]
    bound = second_end + 5
    ep, policy = run(tmp_path / "bound", task, renderer, replies, max_turns=3, response_tokens=bound)
    assert ep.termination == "context_exhausted" and ep.turns == 2
    assert len(ep.response_ids) == second_end <= bound and ep.response_mask[-1] == 1
    assert model_tokens_whole(ep, policy) and ep.response_ids == free.response_ids[:second_end]
    # every turn was offered at most what was left of the response budget
    for prompt, gen in zip(policy.prompts, policy.generations):
        assert len(prompt) - len(ep.prompt_ids) + len(gen.token_ids) <= bound


def test_a_judge_error_ends_on_a_model_token_and_is_raised_to_training(tmp_path, task, renderer):
    box = Toolbox(task, create_workspace(task, tmp_path / "ws", "cpu"), FakeGate())
    policy = ScriptedPolicy(renderer, [call("list_files"), call("verify")])
    front = TokenFront(policy, renderer, TokenLimits(turn_tokens=4096), session="s")
    res = Engine(Wrapped(box, fail_after=1), front, EngineConfig(judge_at_end=True)).run()
    assert res.outcome.error is not None and res.outcome.error.kind == "judge"
    assert front.tokens.mask[-1] == 1 and isinstance(res.error, JudgeFailure)
    assert policy.ended == ["s"]   # the session is released however the episode ends
    with pytest.raises(JudgeFailure):
        run(tmp_path / "again", task, renderer, [call("verify")], wrap=lambda b: Wrapped(b, fail_after=0))


def test_the_episode_id_is_the_policys_session(tmp_path, task, renderer):
    ep, policy = run(tmp_path, task, renderer, [call("list_files"), call("list_files")], max_turns=2)
    assert ep.id == "ep-1" and policy.sessions == ["ep-1", "ep-1"] and policy.ended == ["ep-1"]


def test_the_repetition_warning_reaches_the_token_model(tmp_path, task, renderer):
    ep, _ = run(tmp_path, task, renderer, [call("list_files")] * 6, repeat_warn=2, repeat_limit=4)
    assert ep.termination == "repeated" and ep.turns == 4
    observed = renderer.decode([t for t, m in zip(ep.response_ids, ep.response_mask) if m == 0])
    assert observed.count("[note: you made the same calls with the same results") == 2   # turns 2 and 3


def test_the_reward_shown_is_the_reward_trained_on(tmp_path, task, renderer):
    """Non-default margins: the scripted correct candidate is 2x faster than eager, which earns
    2.0 by default but only `correct` (0.5 here) when a 150% margin is asked. Training builds the
    Toolbox with the run's RewardConfig, so the observation and the record agree."""
    from cuda_agent.train.config import TrainConfig
    from cuda_agent.train.rollout import run_episodes

    reward = RewardConfig(eager_margin=1.5, correct=0.5)
    cfg = TrainConfig(reward=reward, concurrency=1, episode=EpisodeConfig(turn_tokens=4096))
    policy = ScriptedPolicy(renderer, [call("write_file", path="model_new.py", content=GOOD), call("verify"),
                                       call("submit")])
    gate = FakeGate()
    (ep,), failures = run_episodes([task], mode="agentic", gate=gate, policy=policy, renderer=renderer, cfg=cfg,
                                   step=0, workdir=tmp_path / "ws")
    assert not failures and ep.termination == "submitted"
    shown = [m["content"] for m in ep.messages if m["role"] == "tool" and "PASSED" in m["content"]]
    assert shown and all("reward 0.5 (" in text for text in shown)
    assert ep.reward == 0.5 and ep.verdict["reward"] == 0.5
    # the default margins would have said otherwise: the test would catch a second scoring
    assert RewardConfig().rewarded_faster_than_eager == 2.0

    single = ScriptedPolicy(renderer, [f"```python\n{GOOD}```"])
    (warm,), _ = run_episodes([task], mode="single_turn", gate=gate, policy=single, renderer=renderer, cfg=cfg,
                              step=0, workdir=tmp_path / "ws1")
    assert warm.reward == 0.5 and warm.response_mask[-1] == 1


def test_a_verdict_without_the_environments_reward_is_an_internal_error(tmp_path, task, renderer):
    class Unscored:
        def __init__(self, box):
            self.box = box

        def reset(self):
            return self.box.reset()

        def step(self, call):
            cand = self.box.candidate()
            return StepResult(observation="judged", verdict=verdict(task, cand, correct=True), candidate=cand)

        def close(self):
            pass

    box = Toolbox(task, create_workspace(task, tmp_path / "ws", "cpu"), FakeGate())
    front = TokenFront(ScriptedPolicy(renderer, [call("verify")]), renderer, TokenLimits(turn_tokens=4096))
    res = Engine(Unscored(box), front).run()
    assert res.outcome.error is not None and res.outcome.error.kind == "internal"
    assert "without its reward" in res.outcome.message
