"""Token-in/token-out episodes: masks, logprobs, endings and rewards, with the tiny random model's
tokenizer and chat template, scripted replies and a scripted judge."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from agent_server import RELU_TASK  # noqa: E402
from cuda_agent.agent.tools import Toolbox  # noqa: E402
from cuda_agent.agent.workspace import create_workspace  # noqa: E402
from cuda_agent.tasks import Task  # noqa: E402
from cuda_agent.rollout.prompts import agentic_messages  # noqa: E402
from cuda_agent.train.episode import (ChatRenderer, EpisodeConfig, EpisodeRecord, run_agentic_episode,  # noqa: E402
                                      run_single_turn_episode)
from cuda_agent.train.tiny import build_tokenizer  # noqa: E402

from train_fakes import FakeGate, ScriptedPolicy  # noqa: E402

TASK = RELU_TASK


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(build_tokenizer())


@pytest.fixture
def task() -> Task:
    return Task.from_source(TASK, name="relu")


def call(name: str, **args) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


def episode(tmp_path, task, renderer, replies, gate=None, **cfg) -> tuple[EpisodeRecord, ScriptedPolicy, FakeGate]:
    gate = gate or FakeGate()
    ws = create_workspace(task, tmp_path / "ws", "cpu")
    box = Toolbox(task, ws, gate)
    policy = ScriptedPolicy(renderer, replies)
    try:
        ep = run_agentic_episode(task, box, policy, renderer, EpisodeConfig(**{"turn_tokens": 4096, **cfg}))
    finally:
        box.close()
    return ep, policy, gate


def segments(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of the mask."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def test_masks_and_logprobs_line_up_with_the_tokens(tmp_path, task, renderer):
    replies = [call("list_files"), call("write_file", path="model_new.py", content="# GOOD\nclass ModelNew: pass\n"),
               call("submit")]
    ep, policy, gate = episode(tmp_path, task, renderer, replies)
    assert ep.termination == "submitted" and ep.reward == 2.0 and ep.verdict["correct"]
    assert len(ep.response_ids) == len(ep.response_mask) == len(ep.response_logprobs)
    runs = segments(ep.response_mask)
    model_runs = [r for r in runs if r[0] == 1]
    # each model turn is one run of 1s holding exactly the generated tokens and their logprobs
    assert len(model_runs) == 3
    for (_, a, b), gen in zip(model_runs, policy.generations):
        assert ep.response_ids[a:b] == gen.token_ids
        assert ep.response_logprobs[a:b] == gen.logprobs
    assert all(ep.response_logprobs[i] == 0.0 for v, a, b in runs if v == 0 for i in range(a, b))
    # each generation saw exactly the tokens recorded before it: nothing re-tokenised or duplicated
    for (_, a, _b), prompt in zip(model_runs, policy.prompts):
        assert prompt == ep.prompt_ids + ep.response_ids[:a]
    # the observation tokens hold the tool results, the model tokens never do
    obs_text = renderer.decode([t for t, m in zip(ep.response_ids, ep.response_mask) if m == 0])
    assert "model.py" in obs_text and "<tool_response>" in obs_text
    model_text = renderer.decode([t for t, m in zip(ep.response_ids, ep.response_mask) if m == 1])
    assert "<tool_response>" not in model_text


def test_the_token_sequence_is_the_chat_template_of_the_conversation(tmp_path, task, renderer):
    # replies written as the template writes calls (after a newline), so a re-render can match
    replies = ["\n" + call("list_files"), "I will look first.", "\n" + call("read_file", path="model.py")]
    ep, _, _ = episode(tmp_path, task, renderer, replies, max_turns=3)
    assert ep.termination == "max_turns"
    # well-formed turns are re-rendered from the messages exactly as they were sampled
    text = renderer.decode(ep.prompt_ids + ep.response_ids)
    # the sequence ends on the last model turn: its tool result is in the messages, not the tokens
    last = max(i for i, m in enumerate(ep.messages) if m["role"] == "assistant")
    assert ep.messages[-1]["role"] == "tool" and ep.response_mask[-1] == 1
    expected = renderer.tok.apply_chat_template(ep.messages[:last + 1], tools=ep.tools, tokenize=False)
    assert text + renderer.close.removeprefix(renderer.eos_text) == expected
    assert ep.no_call_turns == 1 and ep.turns == 3


def test_a_malformed_call_is_an_observation(tmp_path, task, renderer):
    replies = ['<tool_call>\n{"name": "read_file", "arguments": {"path": </tool_call>', call("no_such_tool")]
    ep, _, gate = episode(tmp_path, task, renderer, replies, max_turns=2)
    assert ep.malformed_calls == 1 and ep.termination == "max_turns"
    tool_msgs = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert "not valid JSON" in tool_msgs[0] and "unknown tool" in tool_msgs[1]
    # nothing was judged during the episode: the final workspace (the starter) was judged once
    assert gate.judged == 1 and ep.reward == -1.0 and ep.verdict is not None


def test_the_token_budget_ends_the_episode(tmp_path, task, renderer):
    prompt_len = len(renderer.prompt_ids(
        agentic_messages(task, "cpu"),
        Toolbox(task, create_workspace(task, tmp_path / "probe", "cpu"), FakeGate()).reset().tools))
    budget = prompt_len + 60
    ep, policy, _ = episode(tmp_path, task, renderer, [call("list_files")] * 5, context_tokens=budget)
    assert ep.termination == "context_exhausted"
    assert len(ep.prompt_ids) + len(ep.response_ids) <= budget
    assert all(len(p) < budget for p in policy.prompts)


def test_a_turn_cut_at_the_token_limit_is_closed_by_observation_tokens(tmp_path, task, renderer):
    ep, policy, _ = episode(tmp_path, task, renderer, ["I was about to write a lonCUT", call("list_files")],
                            max_turns=2)
    first = policy.generations[0]
    assert first.finish == "length" and first.token_ids[-1] != renderer.eos_id
    n = len(first.token_ids)
    assert ep.response_mask[n] == 0
    closing = renderer.decode(ep.response_ids[n:n + 3])
    assert closing.startswith(renderer.eos_text)   # the template's turn end, masked, not the model's


def test_repetition_ends_the_episode(tmp_path, task, renderer):
    ep, _, _ = episode(tmp_path, task, renderer, [call("list_files")] * 10, repeat_limit=3, max_turns=10)
    assert ep.termination == "repeated" and ep.turns == 3


def test_reward_is_the_judges_for_the_best_candidate_and_hacks_are_flagged(tmp_path, task, renderer):
    replies = [call("write_file", path="model_new.py", content="# HACK\nclass ModelNew: pass\n"), call("verify"),
               call("write_file", path="model_new.py", content="# GOOD\nclass ModelNew: pass\n"), call("verify"),
               call("write_file", path="model_new.py", content="# bad\nclass ModelNew: pass\n"), call("verify")]
    ep, _, _ = episode(tmp_path, task, renderer, replies, max_turns=6)
    assert ep.termination == "max_turns"
    assert [v["failure"] for v in ep.verdicts] == ["tampering", None, "mismatch"]
    assert ep.reward == 2.0 and ep.verdict["correct"] and ep.hacking


def test_single_turn_episode_is_judged_on_its_module(renderer, task):
    gate = FakeGate()
    good = "Here it is.\n```python\n# GOOD\nclass ModelNew:\n    pass\n```"
    ep = run_single_turn_episode(task, gate, ScriptedPolicy(renderer, [good]), renderer)
    assert ep.mode == "single_turn" and ep.reward == 2.0 and all(m == 1 for m in ep.response_mask)
    ep = run_single_turn_episode(task, gate, ScriptedPolicy(renderer, ["no code here"]), renderer)
    assert ep.reward == -1.0 and "no ```python block" in ep.reward_reason and gate.judged == 1
