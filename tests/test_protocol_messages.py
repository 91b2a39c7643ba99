"""The worker's messages parsed once, into records (protocol.py): a malformed field reads as the
judge always read it (missing: the default; a wrong type: missing; a negative, NaN or oversized
time: no time), extra keys are ignored, and no parse raises, so a hostile message fails the
candidate where the judge uses it, never the judge. No worker process here."""

from __future__ import annotations

import json
import math

import pytest

from cuda_agent.judge.evaluation import Evaluation, Stop
from cuda_agent.judge.protocol import (MAX_KERNELS, Bandwidth, CallReply, Echo, ErrorCategory, KernelList, LoadInline,
                                       Ready, Reply, parse_loading)
from cuda_agent.judge.verdict import FailureCategory as FC, Verdict

HOSTILE = [None, True, False, 0, -1, 1e308, 10 ** 400, float("nan"), float("inf"), "", "x", [], [1, None, "a"],
           {"a": 1}, {"a": [1, 2]}]


def test_an_empty_message_is_every_default():
    assert Reply.parse({}) == Reply()
    assert CallReply.parse({}) == CallReply()
    assert Ready.parse({}) == Ready() and Ready().gpu_plane is False and Ready().landlock is None
    assert KernelList.parse({}) == KernelList()
    assert Echo.parse({}).echo is None and Bandwidth.parse({}).result is None


@pytest.mark.parametrize("value", HOSTILE)
def test_no_field_of_any_type_makes_a_parse_raise(value):
    for parse in (Reply.parse, CallReply.parse, Ready.parse, KernelList.parse, Echo.parse, Bandwidth.parse,
                  parse_loading):
        keys = {k for cls in (CallReply, Ready, KernelList) for k in cls.__dataclass_fields__}
        parse({k: value for k in keys | {"message", "ms", "echo", "extra"}})


def test_times_are_non_negative_numbers_or_none():
    for bad in (-1, float("nan"), True, "3", None, [1], 10 ** 400):
        assert CallReply.parse({"inside_ms": bad}).inside_ms is None
    assert CallReply.parse({"inside_ms": 3}).inside_ms == 3.0
    assert CallReply.parse({"inside_ms": float("inf")}).inside_ms == math.inf
    assert json.loads("1e400") == math.inf  # what a huge float on the wire is
    reply = CallReply.parse({"stream_ms": 1.5, "lag_ms": -2, "run_delay_ms": "1", "kernel_ms": 0})
    assert (reply.stream_ms, reply.lag_ms, reply.run_delay_ms, reply.kernel_ms) == (1.5, None, None, 0.0)


def test_name_lists_are_text_cut_to_size_and_counted_as_sent():
    reply = CallReply.parse({"ops": ["aten::mm", 5, None], "tampered": "torch.mm", "flags_changed": {"a": 1},
                             "launched": ["k"] * (MAX_KERNELS + 1), "kernels": ["x" * 400]})
    assert reply.ops == ("aten::mm", "5", "None")
    assert reply.tampered == () and reply.flags_changed == ()
    assert len(reply.launched) == MAX_KERNELS and reply.launched_sent == MAX_KERNELS + 1
    assert reply.kernels == ("x" * 300,) and reply.kernels_sent == 1
    listed = KernelList.parse({"ok": True, "op": "kernels", "kernels": "k", "kernel_ms": -1})
    merged = reply.with_kernels(listed)
    assert (merged.kernels, merged.kernels_sent, merged.kernel_ms) == ((), 0, None)
    assert merged.ops == reply.ops and merged.launched_sent == MAX_KERNELS + 1


def test_owners_keep_lists_of_chains_only():
    owners = {"k1": ["a", "b"] * 8, "k2": "not a list", 3: [1]}
    assert CallReply.parse({"owners": owners}).owners == {"k1": ["a", "b"] * 4, "3": ["1"]}
    assert CallReply.parse({"owners": ["k1"]}).owners is None
    assert CallReply.parse({"owners": {}}).owners == {}  # a dict, checked (and empty)


def test_structure_timing_and_op_read_as_before():
    assert CallReply.parse({}).structure is None and f"{CallReply.parse({}).structure}" == "None"
    assert CallReply.parse({"structure": 5}).structure == "5"
    assert CallReply.parse({"timing": None}).timing == "events"
    assert CallReply.parse({"timing": "gated-but-much-longer-than-16"}).timing == "gated-but-much-l"
    assert Reply.parse({"op": 5}).op is None and Reply.parse({"op": "staged"}).op == "staged"
    assert Reply.parse({"ok": 1}).ok is True and Reply.parse({"ok": "false"}).ok is True  # truthiness, as ever


def test_ready_flags_count_only_when_exactly_true():
    ready = Ready.parse({"ok": True, "gpu_plane": 1, "judge_release": "true", "staged_inputs": True,
                         "audit_hook": True, "landlock": "yes", "timing_gate": "", "staging_error": 0,
                         "launch_observer": "no CUPTI", "unmatched": ["w", 3], "gpu_plane_error": None})
    assert (ready.gpu_plane, ready.judge_release, ready.staged_inputs, ready.audit_hook) == (False, False, True, True)
    assert ready.landlock is None and Ready.parse({"landlock": False}).landlock is False
    assert ready.timing_gate is None and ready.staging_error is None and ready.launch_observer == "no CUPTI"
    assert ready.unmatched == ("w", "3")
    assert str(ready.gpu_plane_error) == "None" == str(Ready.parse({}).gpu_plane_error)


def test_a_build_request_goes_to_the_build_step_as_sent():
    request = {"op": "build", "name": "ext", "cpp_sources": 5}
    loaded = parse_loading(request)
    assert isinstance(loaded, LoadInline) and loaded.request is request
    assert isinstance(parse_loading({"ok": True}), Ready)


def _stop(reply: dict, kind="candidate", setup=False) -> Stop:
    ev = Evaluation(kind=kind, verdict=Verdict(task_id="t", task_name="t", candidate_hash="c", device="cpu"))
    with pytest.raises(Stop) as caught:
        ev.reported_error(Reply.parse(reply), setup=setup)
    return caught.value


def test_an_error_reply_reads_its_message_and_category_as_before():
    assert _stop({"ok": False}).failure.message == "the candidate reported an error"
    assert _stop({"ok": False, "message": None}).failure.message == "None"  # present, null: its text
    assert _stop({"ok": False, "message": ["a", 1]}).failure.message == "['a', 1]"
    assert _stop({"ok": False, "message": "m" * 7000}).failure.message == "m" * 6000
    assert _stop({"ok": False}, kind="baseline").failure.message == "the baseline process reported an error"
    assert _stop({"ok": False, "category": ["oom"]}).failure.category is FC.RUNTIME
    assert _stop({"ok": False, "category": "oom"}).failure.category is FC.OOM
    assert Reply.parse({"category": 7}).category is ErrorCategory.RUNTIME


def test_blocked_keeps_the_first_five_as_text():
    reply = Reply.parse({"blocked": [f"open {k}" for k in range(9)] + ["x" * 300]})
    assert reply.blocked == tuple(f"open {k}" for k in range(5))
    assert Reply.parse({"blocked": "open /etc/shadow"}).blocked == ()
    assert Reply.parse({"blocked": [["x" * 300]]}).blocked == (str(["x" * 300])[:200],)
    stop = _stop({"ok": False, "blocked": [1]})
    assert stop.failure.category is FC.POLICY and stop.failure.message == "the sandbox refused: 1"


def test_bandwidth_result_is_its_times_or_else_its_message():
    assert Bandwidth.parse({"ms": {"read": 1.0}}).result == {"read": 1.0}
    assert Bandwidth.parse({"ms": {}, "message": "no region"}).result == "no region"


class _DeadWorker:
    """The judge's view of a worker process that has exited (sandbox.Sandboxed, as Session uses it)."""

    class _Popen:
        def poll(self):
            return 1

        def wait(self, timeout=None):
            return 1

    proc = _Popen()

    def alive(self):
        return False

    def exit_description(self):
        return "exited with status 1"

    def log_tail(self, n):
        return "torch.OutOfMemoryError: CUDA out of memory"

    def rss_mb(self):
        return 0.0

    def disk_used_mb(self):
        return 0.0


@pytest.mark.parametrize("loading", [False, True])
def test_a_worker_that_dies_before_the_candidates_code_ran_is_the_judges_failure(loading):
    """The worker says `loading` just before the candidate's code (worker.main): a death before it
    (CUDA out of memory while the harness set up, say) is the judge's failure, never the candidate's
    crash; a death after it is the candidate's crash (a candidate cannot die 'before' its own code)."""
    import socket
    import time

    from cuda_agent.judge.starter import Starter
    from cuda_agent.judge.protocol import Channel
    from cuda_agent.judge.session import Session

    ours, theirs = socket.socketpair()
    session = Session(_DeadWorker(), Channel(ours), None, memory_limit_mb=1000, disk_limit_mb=1000)
    if loading:
        Channel(theirs).send({"op": "loading"})
    theirs.close()
    with pytest.raises(Stop) as stop:  # the harness's loop while the candidate loads (no build asked: no self)
        Starter.serve_init(None, session, None, time.monotonic() + 5)
    assert session.candidate_code is loading
    assert stop.value.failure.category is (FC.CRASH if loading else FC.JUDGE), stop.value.failure
    assert "out of memory" in stop.value.failure.message


def test_a_message_to_a_worker_that_has_died_fails_the_run_with_how_it_died():
    """A worker that died between two messages (its end of the socket gone): the judge's next send
    fails with a broken pipe or a reset, which must end the run as a death of the process, as a
    read does, and never escape as the judge's own BrokenPipeError (a task set's reference check
    reported one as the task's runtime error)."""
    import socket

    from cuda_agent.judge.protocol import Channel
    from cuda_agent.judge.session import Session

    ours, theirs = socket.socketpair()
    session = Session(_DeadWorker(), Channel(ours), None, memory_limit_mb=1000, disk_limit_mb=1000)
    session.candidate_code = True
    theirs.close()
    with pytest.raises(Stop) as stop:
        for _ in range(100):   # the first sends may still fill the buffer of a socket just closed
            session.send({"op": "prepare"}, "call 3")
    assert stop.value.failure.category is FC.CRASH, stop.value.failure
    assert "died during call 3" in stop.value.failure.message and "exited with status 1" in stop.value.failure.message
