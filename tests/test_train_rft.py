"""The RFT filter and verl's SFT parquet."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from cuda_agent.train.episode import EpisodeRecord
from cuda_agent.train.rft import RFTFilter, filter_episodes, rejection, write_sft_parquet


def ep(**kw) -> EpisodeRecord:
    base = dict(id="e", task_id="t", task_name="relu", mode="agentic", prompt_ids=[1, 2], response_ids=[3, 4],
                response_mask=[1, 0], response_logprobs=[-0.1, 0.0], turns=2, termination="submitted",
                reward=2.0, reward_reason="correct", tools=[{"type": "function", "function": {"name": "verify"}}],
                messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                          {"role": "assistant", "content": "",
                           "tool_calls": [{"id": "c1", "type": "function",
                                           "function": {"name": "verify", "arguments": "{}"}}]},
                          {"role": "tool", "tool_call_id": "c1", "name": "verify", "content": "PASSED"}])
    return EpisodeRecord(**{**base, **kw})


def test_each_rejection_reason():
    f = RFTFilter()
    assert rejection(ep(), f) is None
    assert rejection(ep(reward=-1.0), f) == "reward"
    assert rejection(ep(hacking=True), f) == "hacking"
    assert rejection(ep(malformed_calls=1), f) == "malformed_calls"
    assert rejection(ep(no_call_turns=1), f) == "no_call_turns"
    assert rejection(ep(no_call_turns=1, mode="single_turn"), f) is None
    assert rejection(ep(termination="repeated"), f) == "repeated"
    assert rejection(ep(termination="context_exhausted"), f) == "context_exhausted"
    assert rejection(ep(turns=9), RFTFilter(max_turns=5)) == "too_many_turns"
    assert rejection(ep(reward=1.0), RFTFilter(min_reward=1.0)) == "reward"
    assert rejection(ep(malformed_calls=2), RFTFilter(max_malformed_calls=2)) is None
    # a hacking episode is never kept, whatever its reward
    assert rejection(ep(hacking=True, reward=3.0), f) == "hacking"


def test_filter_counts_reasons():
    kept, why = filter_episodes([ep(), ep(reward=-1.0), ep(reward=-1.0), ep(hacking=True)], RFTFilter())
    assert len(kept) == 1 and why == {"reward": 2, "hacking": 1}


def test_sft_parquet_holds_messages_and_tools(tmp_path):
    path = write_sft_parquet([ep(), ep(id="e2")], tmp_path / "rft.parquet")
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == 2 and rows[0]["episode_id"] == "e"
    msgs = rows[0]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    call = msgs[2]["tool_calls"][0]
    assert call["function"] == {"name": "verify", "arguments": "{}"}
    assert msgs[3]["tool_call_id"] == "c1"
    assert json.loads(rows[0]["tools"])[0]["function"]["name"] == "verify"
