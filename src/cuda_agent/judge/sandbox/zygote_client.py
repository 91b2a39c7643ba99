"""The judge's side of the zygote (judge/zygote.py): a trusted process that forks candidate
processes from an interpreter that has already imported torch."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

from .common import PR_SET_PDEATHSIG, _libc, python_argv


class _ZygoteChild:
    """The `subprocess.Popen` surface the judge uses, for a process forked by the zygote."""

    def __init__(self, zygote: "Zygote", pid: int):
        self.zygote, self.pid, self.returncode = zygote, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode


class Zygote:
    """A trusted process that imports torch and the harness once, then forks one process per
    candidate: a candidate process starts in milliseconds instead of seconds. It never runs
    candidate code itself and never initialises CUDA (a forked CUDA context is unusable)."""

    def __init__(self, env: dict[str, str] | None = None):
        import threading

        self._lock = threading.Lock()
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(python_argv("cuda_agent.judge.zygote", str(theirs.fileno())),
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})},
                                     preexec_fn=lambda: _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0))
        theirs.close()
        self._ok: bool | None = None

    def usable(self) -> bool:
        if self._ok is None:
            try:
                self._ok = bool(self._request({"op": "hello"}, timeout=120).get("ok"))
            except (OSError, ValueError):
                self._ok = False
        return self._ok

    def _request(self, msg: dict, fds=(), timeout: float = 30) -> dict:
        with self._lock:
            self.sock.settimeout(timeout)
            socket.send_fds(self.sock, [json.dumps(msg).encode()], list(fds))
            data = self.sock.recv(1 << 16)
        if not data:
            raise OSError("zygote exited")
        return json.loads(data)

    def spawn(self, target: str, args: list, fds, setup: dict) -> int:
        reply = self._request({"op": "spawn", "target": target, "args": list(args), "setup": setup}, fds)
        if "pid" not in reply:
            raise OSError(f"zygote could not start a process: {reply.get('error')}")
        return int(reply["pid"])

    def status(self, pid: int) -> int | None:
        reply = self._request({"op": "status", "pid": pid})
        return reply.get("returncode")

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            self.proc.kill()
            self.proc.wait()
