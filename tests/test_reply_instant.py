"""The output and the clocks at one instant at the reply (calls.py `outputs_at_reply`,
`late_writes`): the judge's copy of a call's outputs is private from the moment the reply is read,
and an output the candidate process changes after it fails the call. Real data plane (memfd), no
candidate process: the "late" write stands for a thread team still working after the reply."""

from __future__ import annotations

import types

import torch

from cuda_agent.judge.calls import late_writes, outputs_at_reply
from cuda_agent.judge.protocol import CallReply, DataPlane
from cuda_agent.judge.tensorio import pack


def _session_with(outputs: list) -> tuple[types.SimpleNamespace, CallReply]:
    plane = DataPlane.create(4096, 1 << 16)
    meta = pack(outputs, plane.view, plane.out_offset, plane.out_size)
    session = types.SimpleNamespace(plane=plane, calls=plane.view, shared=None)
    return session, CallReply.parse({"ok": True, "outputs": meta})


def _write_late(session, reply: CallReply, value: float) -> None:
    """What a thread of the candidate would do after replying: write the output region in place."""
    m = reply.outputs[0]
    raw = torch.frombuffer(session.plane.view, dtype=torch.uint8, count=m["nbytes"], offset=m["offset"])
    raw.view(torch.float32).fill_(value)


def test_the_copy_at_the_reply_is_private_and_a_late_write_fails_the_call():
    session, reply = _session_with([torch.arange(64, dtype=torch.float32)])
    at_reply = outputs_at_reply(session, reply)
    assert torch.equal(at_reply[0], torch.arange(64, dtype=torch.float32))
    assert late_writes(session, reply, at_reply) is None
    _write_late(session, reply, 7.0)
    assert torch.equal(at_reply[0], torch.arange(64, dtype=torch.float32))  # the judged copy did not move
    why = late_writes(session, reply, at_reply)
    assert why is not None and "after the call replied" in why


def test_nan_outputs_unchanged_are_not_a_late_write():
    session, reply = _session_with([torch.full((8,), float("nan")), 3])
    at_reply = outputs_at_reply(session, reply)
    assert late_writes(session, reply, at_reply) is None  # compared as bytes: NaN equals itself


def test_an_unusable_layout_is_left_to_the_check():
    session, reply = _session_with([torch.ones(4)])
    reply.outputs[0]["offset"] = -64  # the layout as sent (validated where it is read)
    assert outputs_at_reply(session, reply) is None
    assert late_writes(session, reply, None) is None
