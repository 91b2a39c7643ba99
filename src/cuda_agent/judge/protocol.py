"""The channel between the trusted judge and an untrusted candidate process.

Control messages are length-prefixed JSON over a socketpair; tensor bytes travel through a
memfd both processes map. Nothing the candidate sends is ever unpickled or evaluated: the
parent parses bounded JSON and copies raw bytes, then validates both against what it expects.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import struct
import time
from dataclasses import dataclass, replace
from enum import Enum
from typing import Literal, Required, TypedDict

MAX_MESSAGE_BYTES = 8 << 20
# The file the judge writes into the memcheck process's folder once the sanitizer is attached
# (judge/memcheck.py writes it, judge/memcheck_run.py waits for it)
MEMCHECK_GO_FILE = "go"
_HEADER = struct.Struct("!I")


class ErrorCategory(str, Enum):
    """What a worker's error reply blames, the one vocabulary of both sides. Each value is the
    `FailureCategory` of the same name, so the judge maps a reply without a table of its own."""

    JUDGE = "judge"      # the worker's own set-up failed before any candidate code ran
    LOAD = "load"        # importing the candidate (or loading its library) failed
    INIT = "init"        # ModelNew() raised
    RUNTIME = "runtime"  # forward raised
    OOM = "oom"          # forward ran out of memory

    @classmethod
    def parse(cls, value: object) -> "ErrorCategory":
        """A reply's category; anything else is the candidate's own runtime error (its process
        wrote the reply, so an unknown word is not believed to be more)."""
        try:
            return cls(value)
        except ValueError:
            return cls.RUNTIME


# -- the messages of the call protocol ------------------------------------------------------------
# Typed for both sides; on the wire they are JSON objects (`Channel`). What the judge sends is a
# TypedDict below; what the worker sends comes from a process that runs candidate code and is
# parsed into the records further down, so a malformed reply fails the candidate, never the judge.
# Tensors travel as `pack` metadata (tensorio.py) describing bytes in the data plane.

class InitRequest(TypedDict):
    """Judge -> worker, once: what to load and how to construct ModelNew."""

    device: str
    candidate_path: str
    reference_path: str
    library: str | None            # the workspace's built extension, or None
    init_args: list                # pack metadata of the init arguments (in the data plane)
    state: list                    # pack metadata of the reference's state_dict values
    state_names: list[str]
    init_seed: int
    flush: bool
    flush_inputs: str              # CUDA: flush again once a call's inputs are in place: on, auto, off (JudgeConfig)
    touch_pages: bool              # CUDA: touch the inputs' and outputs' pages before the clock (JudgeConfig)
    stage_inputs: int              # CUDA, GPU region: bytes of the block in the process's own memory where
                                   # calls read a copy of their inputs (0: they read the region)
    trusted: bool                  # a reference or baseline: no candidate policy
    observer: str                  # the judge's operator observer library
    launches: str | None           # CUDA: the judge's launch observer library (None where it cannot be built)
    policy: str
    poison_bytes: int
    gpu_plane: str | None          # CUDA IPC handle of the shared GPU region (hex), or None
    require: dict                  # the isolation the worker must find itself in


class CallRequest(TypedDict):
    """Judge -> worker: run forward on the inputs now in the data plane (with `release`: on the
    inputs the judge writes there once the worker has said `enqueued`)."""

    op: Literal["call"]
    index: int
    inputs: list
    kernels: bool                  # take CUDA's activity records of the kernels that ran (checked calls only)
    release: int | None            # the judge writes the inputs and this token at its release (timing.py)
    staged: bool                   # read the inputs from the process's copy made by `stage` (the reply is
                                   # then followed by `inputs_back`, the copy written back to the region)


class OpRequest(TypedDict):
    """Judge -> worker: `prepare` (untimed: flush caches, poison the allocator), `echo` (send the
    inputs back as forward left them), `bandwidth` (a diagnostic, timing.bandwidth_probe) or `exit`."""

    op: Literal["prepare", "echo", "bandwidth", "exit"]


class StageRequest(TypedDict):
    """Judge -> worker, untimed, once a call's inputs are in the GPU region: copy them into the
    process's own memory (answered by `staged`)."""

    op: Literal["stage"]
    inputs: list                   # the call's metadata, as `call` will carry it


class BuildRequest(TypedDict):
    """Worker -> judge: a `load_inline` call, for the judge to build in its own sandbox."""

    op: Literal["build"]
    name: str
    cpp_sources: object
    cuda_sources: object
    functions: object
    cflags: object
    cuda_cflags: object
    ldflags: object
    with_cuda: bool | None
    with_pytorch_error_handling: bool


class BuildAnswer(TypedDict, total=False):
    """Judge -> worker: the built library's path, or why there is none."""

    ok: Required[bool]
    library: str
    message: str


# -- what the worker sends, parsed once -----------------------------------------------------------
# Every message from the worker is parsed where it is received (`Session.recv`) into one of the
# frozen records below; the judge reads their attributes, never the JSON. A parse never raises:
# the process that wrote the message runs candidate code, so a missing field is its default, a
# field of the wrong type reads as missing (numbers: finite-or-infinite, non-negative, else None;
# lists of names: each item as text, at most 4096), an unknown error category as the candidate's
# runtime error and unknown keys are ignored. Tensors stay `pack` metadata (tensorio.py), which
# `unpack` validates where the bytes are read.

def _num(x) -> float | None:
    """A time the worker reports: a non-negative number (not NaN, not a bool), else None."""
    if not isinstance(x, (int, float)) or isinstance(x, bool) or x != x or x < 0:
        return None
    try:
        return float(x)
    except OverflowError:  # an integer too large for a float
        return None


def _strs(x) -> tuple[str, ...]:
    """A list of names (at most 4096, each cut at 300 characters); anything else reads as none."""
    return tuple(str(s)[:300] for s in x[:4096]) if isinstance(x, list) else ()


def _count(x) -> int:
    """The length of a list as sent (before `_strs` cuts it), 0 for anything else."""
    return len(x) if isinstance(x, list) else 0


def _note(x) -> str | None:
    """A reason the worker gives (a note in the verdict): present and not empty, as text."""
    return str(x) if x else None


def _text(raw: dict, key: str) -> str | None:
    """A field as text; None where it is absent or null."""
    x = raw.get(key)
    return None if x is None else str(x)


@dataclass(frozen=True)
class Reply:
    """Worker -> judge: any answer. Failed (`ok` false), it is an error reply: what failed
    (`category`), why (`message`) and what the sandbox refused so far (`blocked`)."""

    ok: bool = False
    op: str | None = None            # what the message is, for the messages that name it
    category: ErrorCategory = ErrorCategory.RUNTIME
    message: str | None = None       # None: absent (a null is the text "None")
    blocked: tuple[str, ...] = ()    # the first five refusals, each cut at 200 characters

    @classmethod
    def parse(cls, raw: dict):
        return cls(**cls._fields(raw))

    @staticmethod
    def _fields(raw: dict) -> dict:
        op, blocked = raw.get("op"), raw.get("blocked")
        return dict(ok=bool(raw.get("ok")), op=op if isinstance(op, str) else None,
                    category=ErrorCategory.parse(raw.get("category")),
                    message=str(raw["message"]) if "message" in raw else None,
                    blocked=tuple(str(b)[:200] for b in blocked[:5]) if isinstance(blocked, list) else ())


@dataclass(frozen=True)
class Ready(Reply):
    """Worker -> judge: ModelNew is constructed."""

    unmatched: tuple[str, ...] = ()  # parameters not copied from Model (another name or shape)
    gpu_plane: bool = False          # the shared GPU region is mapped
    gpu_plane_error: str | None = None
    audit_hook: bool = False         # the worker's audit hook is installed
    landlock: bool | None = None     # kept out of the judge's work root (sandbox.landlock_confined)
    timing_gate: str | None = None   # why calls are timed without the gate, if they are
    judge_release: bool = False      # its gate polls the control page: the judge can open it
    staged_inputs: bool = False      # a block of its own memory holds each call's inputs (stage_inputs)
    staging_error: str | None = None  # why it does not
    launch_observer: str | None = None  # CUDA: why kernel launches are not observed on every call

    @classmethod
    def parse(cls, raw: dict) -> "Ready":
        landlock = raw.get("landlock")
        return cls(**cls._fields(raw), unmatched=_strs(raw.get("unmatched")),
                   gpu_plane=raw.get("gpu_plane") is True, gpu_plane_error=_text(raw, "gpu_plane_error"),
                   audit_hook=raw.get("audit_hook") is True,
                   landlock=landlock if isinstance(landlock, bool) else None,
                   timing_gate=_note(raw.get("timing_gate")), judge_release=raw.get("judge_release") is True,
                   staged_inputs=raw.get("staged_inputs") is True, staging_error=_note(raw.get("staging_error")),
                   launch_observer=_note(raw.get("launch_observer")))


@dataclass(frozen=True)
class LoadInline:
    """Worker -> judge, while ModelNew is constructed: a `load_inline` call for the judge to build
    in its own sandbox. The request goes as sent to the build step, which reads it defensively
    (builds.plan.spec_from_request)."""

    request: dict


@dataclass(frozen=True)
class Loading:
    """Worker -> judge: the harness is set up and the process confined; the candidate's code loads
    next. A process that dies before sending this ran none of that code, so its death is the
    judge's failure (a GPU out of memory at set-up, say), never the candidate's crash."""


def parse_loading(raw: dict) -> "Loading | LoadInline | Ready":
    """A message while the candidate loads: the start of its code, a build request, or the end of
    loading (or an error)."""
    op = raw.get("op")
    return Loading() if op == "loading" else LoadInline(raw) if op == "build" else Ready.parse(raw)


# The most distinct kernel names a call may report (launched, or ran); one more says that there
# were more, which the judge refuses: a list cut short could hide a name the policy forbids.
MAX_KERNELS = 4096


@dataclass(frozen=True)
class KernelList(Reply):
    """Worker -> judge, after a checked call's reply on CUDA (outside the call's clock)."""

    kernels: tuple[str, ...] = ()    # the CUDA kernels that ran
    kernels_sent: int = 0            # how many names were sent (over MAX_KERNELS: too many to check)
    kernel_ms: float | None = None   # their device time (CUDA activity records, the gate left out)

    @classmethod
    def parse(cls, raw: dict) -> "KernelList":
        return cls(**cls._fields(raw), kernels=_strs(raw.get("kernels")), kernels_sent=_count(raw.get("kernels")),
                   kernel_ms=_num(raw.get("kernel_ms")))


@dataclass(frozen=True)
class CallReply(Reply):
    """Worker -> judge: a call's outputs and what was observed during it. On a call the judge
    releases, the message before it is `op` "enqueued": forward has enqueued its work behind the
    gate (or, with no gate, is about to wait for the release before it starts)."""

    inside_ms: float | None = None     # the time the worker claims (checked against the judge's clock)
    stream_ms: float | None = None     # gated calls: start to end marker (inside_ms adds work past the end)
    lag_ms: float | None = None        # gated calls: the idle marker's lag behind the end marker (timing.py)
    run_delay_ms: float | None = None  # gated calls: the timing thread's wait for a core meanwhile
    timing: str = "events"             # how it timed the call: gated, events, cpu
    structure: str | None = None       # "tensor", "tuple", "list", ... (None: not said)
    outputs: object = None             # pack metadata of the outputs (in the data plane; `unpack` checks it)
    tampered: tuple[str, ...] = ()     # library functions replaced during the call
    ops: tuple[str, ...] = ()          # ATen operators the call ran (observer.cpp)
    flags_changed: tuple[str, ...] = ()  # global numeric settings changed
    launched: tuple[str, ...] = ()     # the CUDA kernels the call launched (launches.cpp)
    launched_sent: int = 0             # how many launched names were sent
    owners: dict[str, list[str]] | None = None  # who issued each of them: image chains (launches.cpp `issuer`)
    kernels: tuple[str, ...] = ()      # the CUDA kernels that ran, from the `KernelList` after it
    kernels_sent: int = 0
    kernel_ms: float | None = None     # and their device time, from the same message

    @classmethod
    def parse(cls, raw: dict) -> "CallReply":
        owners = raw.get("owners")
        if isinstance(owners, dict):  # a chain cut short would lose its issuer, at its end
            owners = {str(k)[:300]: [str(c)[:4096] for c in v[:8]]
                      for k, v in list(owners.items())[:MAX_KERNELS + 1] if isinstance(v, list)}
        else:
            owners = None
        return cls(**cls._fields(raw), inside_ms=_num(raw.get("inside_ms")), stream_ms=_num(raw.get("stream_ms")),
                   lag_ms=_num(raw.get("lag_ms")), run_delay_ms=_num(raw.get("run_delay_ms")),
                   timing=str(raw.get("timing") or "events")[:16], structure=_text(raw, "structure"),
                   outputs=raw.get("outputs"), tampered=_strs(raw.get("tampered")), ops=_strs(raw.get("ops")),
                   flags_changed=_strs(raw.get("flags_changed")), launched=_strs(raw.get("launched")),
                   launched_sent=_count(raw.get("launched")), owners=owners, kernels=_strs(raw.get("kernels")),
                   kernels_sent=_count(raw.get("kernels")), kernel_ms=_num(raw.get("kernel_ms")))

    def with_kernels(self, listed: KernelList) -> "CallReply":
        """The reply with the kernels that ran, as the message after it listed them."""
        return replace(self, kernels=listed.kernels, kernels_sent=listed.kernels_sent, kernel_ms=listed.kernel_ms)


@dataclass(frozen=True)
class Echo(Reply):
    """Worker -> judge: the reply to `echo` (the inputs as forward left them)."""

    echo: object = None              # pack metadata of the inputs (`unpack` checks it)

    @classmethod
    def parse(cls, raw: dict) -> "Echo":
        return cls(**cls._fields(raw), echo=raw.get("echo"))


@dataclass(frozen=True)
class Bandwidth(Reply):
    """Worker -> judge: the reply to `bandwidth` (a diagnostic, noted as sent)."""

    result: object = None            # its times (ms), or why there are none

    @classmethod
    def parse(cls, raw: dict) -> "Bandwidth":
        return cls(**cls._fields(raw), result=raw.get("ms") or raw.get("message"))


class ChannelClosed(EOFError):
    """The other side closed the channel (it exited or crashed)."""


class ChannelTimeout(TimeoutError):
    """No message within the deadline."""


class ProtocolError(ValueError):
    """A message that is not what the protocol allows (oversized, not JSON, not an object)."""


class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buf = bytearray()

    def send(self, message: dict) -> None:
        payload = json.dumps(message, separators=(",", ":")).encode()
        self.sock.sendall(_HEADER.pack(len(payload)) + payload)

    def _fill(self, n: int, deadline: float | None) -> None:
        while len(self._buf) < n:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ChannelTimeout("no reply in time")
                self.sock.settimeout(remaining)
            else:
                self.sock.settimeout(None)
            try:
                chunk = self.sock.recv(max(65536, n - len(self._buf)))
            except socket.timeout:
                raise ChannelTimeout("no reply in time") from None
            except (ConnectionResetError, BrokenPipeError):
                raise ChannelClosed("connection reset") from None
            if not chunk:
                raise ChannelClosed("channel closed")
            self._buf += chunk

    def recv(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._fill(_HEADER.size, deadline)
        (size,) = _HEADER.unpack(bytes(self._buf[: _HEADER.size]))
        if size > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message of {size} bytes exceeds {MAX_MESSAGE_BYTES}")
        self._fill(_HEADER.size + size, deadline)
        payload = bytes(self._buf[_HEADER.size: _HEADER.size + size])
        del self._buf[: _HEADER.size + size]
        try:
            message = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ProtocolError("message is not JSON") from None
        if not isinstance(message, dict):
            raise ProtocolError("message is not a JSON object")
        return message

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


CONTROL_BYTES = 4096  # the plane's last page: the judge's release word for the timing gate (timing.py)


@dataclass
class DataPlane:
    """A shared byte region (memfd): an input half, an output half and, in its last page, the
    control word through which the judge itself releases a gated call (timing.py)."""

    fd: int
    size: int
    in_size: int
    pinned_ptr: int | None = None

    @classmethod
    def create(cls, in_size: int, out_size: int) -> "DataPlane":
        in_size = _round(max(in_size, 4096))
        out_size = _round(max(out_size, 4096))
        fd = os.memfd_create("cuda-agent-data", 0)
        os.ftruncate(fd, in_size + out_size + CONTROL_BYTES)
        plane = cls(fd=fd, size=in_size + out_size + CONTROL_BYTES, in_size=in_size)
        plane.map()
        return plane

    def map(self) -> None:
        self.mm = mmap.mmap(self.fd, self.size)
        self.view = memoryview(self.mm)

    def pin(self) -> None:
        """Page-lock the region (CUDA) so copies to and from the GPU run at full DMA speed."""
        import ctypes

        import torch

        ptr = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        if torch.cuda.cudart().cudaHostRegister(ptr, self.size, 0) == 0:
            self.pinned_ptr = ptr

    @property
    def out_offset(self) -> int:
        return self.in_size

    @property
    def out_size(self) -> int:
        return self.size - self.in_size - CONTROL_BYTES

    @property
    def control_offset(self) -> int:
        return self.size - CONTROL_BYTES

    def control_address(self) -> int:
        """Where the control page is mapped in this process (page-aligned)."""
        import ctypes

        return ctypes.addressof(ctypes.c_char.from_buffer(self.mm, self.control_offset))

    def release(self, token: int) -> None:
        """The judge's release of a gated call: the gate kernel waits for this word to equal `token`."""
        self.view[self.control_offset: self.control_offset + 4] = int(token).to_bytes(4, "little", signed=True)

    def close(self) -> None:
        if self.pinned_ptr is not None:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self.pinned_ptr)
            self.pinned_ptr = None
        try:
            self.view.release()
            self.mm.close()
        except (AttributeError, BufferError, ValueError):
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass


def _round(n: int) -> int:
    return (n + 4095) // 4096 * 4096


PLANE_MESSAGE_BYTES = 128


def receive_plane(sock: socket.socket) -> tuple[int, int, int]:
    """The first message of a spare: the data plane's descriptor and sizes (fixed length, so the
    protocol messages after it are left for the Channel)."""
    data, fds, _, _ = socket.recv_fds(sock, PLANE_MESSAGE_BYTES, 1)
    while len(data) < PLANE_MESSAGE_BYTES:
        more = sock.recv(PLANE_MESSAGE_BYTES - len(data))
        if not more:
            raise EOFError("the judge closed the connection")
        data += more
    if len(fds) != 1:
        raise RuntimeError("no data plane descriptor received")
    hello = json.loads(data.rstrip(b" "))
    return fds[0], int(hello["size"]), int(hello["in_size"])


def send_plane(sock: socket.socket, fd: int, size: int, in_size: int) -> None:
    data = json.dumps({"size": size, "in_size": in_size}).encode().ljust(PLANE_MESSAGE_BYTES, b" ")
    socket.send_fds(sock, [data], [fd])
