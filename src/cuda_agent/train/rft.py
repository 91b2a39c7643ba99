"""Rejection fine-tuning data: which stored episodes the actor is fine-tuned on, and their export
as verl SFT data (parquet with `messages` and `tools`, loss on assistant turns).

CUDA Agent keeps trajectories with a positive reward and drops inefficient loops and invalid tool
calls; `RFTFilter` says what that means here, and every rejection is counted by its reason.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from .episode import EpisodeRecord


class RFTFilter(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    min_reward: float = Field(0.0, description="keep episodes whose reward is above this (milestones: -1/1/2/3)")
    max_malformed_calls: int = Field(0, ge=0, description="malformed <tool_call> blocks allowed")
    max_no_call_turns: int = Field(0, ge=0, description="turns without a tool call allowed (agentic episodes)")
    drop_repeated: bool = Field(True, description="drop episodes ended by a repetition loop")
    drop_hacking: bool = Field(True, description="drop episodes with any tampering/timing verdict")
    drop_truncated_turns: bool = Field(True, description="drop episodes whose last turn was cut at the token limit")
    max_turns: int | None = Field(None, ge=1, description="drop episodes longer than this many turns")


def rejection(ep: EpisodeRecord, f: RFTFilter) -> str | None:
    """Why `ep` is not training data, or None to keep it."""
    if ep.hacking and f.drop_hacking:
        return "hacking"
    if not ep.reward > f.min_reward:
        return "reward"
    if ep.malformed_calls > f.max_malformed_calls:
        return "malformed_calls"
    if ep.mode == "agentic" and ep.no_call_turns > f.max_no_call_turns:
        return "no_call_turns"
    if f.drop_repeated and ep.termination == "repeated":
        return "repeated"
    if f.drop_truncated_turns and ep.termination == "context_exhausted":
        return "context_exhausted"
    if f.max_turns is not None and ep.turns > f.max_turns:
        return "too_many_turns"
    return None


def filter_episodes(eps: list[EpisodeRecord], f: RFTFilter) -> tuple[list[EpisodeRecord], Counter]:
    kept, why = [], Counter()
    for ep in eps:
        reason = rejection(ep, f)
        if reason is None:
            kept.append(ep)
        else:
            why[reason] += 1
    return kept, why


def sft_rows(eps: list[EpisodeRecord]) -> list[dict]:
    """verl's multi-turn SFT rows: `messages` in OpenAI form (tool calls structured, their arguments
    as JSON text so every row has one parquet type; chat templates print a string argument as is),
    `tools` as JSON text (the schemas' varying structures do not fit one parquet type), and the
    episode's tokens, `input_ids` (prompt + response) and `loss_mask` (1 on the model's tokens),
    which `verl_sft.CudaAgentSFTDataset` trains on as sampled."""
    rows = []
    for ep in eps:
        messages = []
        for m in ep.messages:
            messages.append({
                "role": m["role"], "content": m.get("content") or "",
                "tool_calls": [{"id": c["id"], "type": "function",
                                "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                               for c in m.get("tool_calls") or []] or None,
                "tool_call_id": m.get("tool_call_id"), "name": m.get("name")})
        rows.append({"messages": messages, "tools": json.dumps(ep.tools), "episode_id": ep.id,
                     "task_id": ep.task_id, "reward": ep.reward,
                     # the sampled tokens themselves: SFT trains on these (verl_sft.CudaAgentSFTDataset)
                     "input_ids": list(ep.prompt_ids) + list(ep.response_ids),
                     "loss_mask": [0] * len(ep.prompt_ids) + list(ep.response_mask)})
    return rows


def write_sft_parquet(eps: list[EpisodeRecord], path: Path) -> Path:
    """Write the kept episodes for verl's SFT trainer (`data.multiturn.messages_key=messages`,
    `data.multiturn.tools_key=tools`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(sft_rows(eps)), path)
    return path
