"""The zygote: imports torch and the harness once, then forks a process per request.

Trusted: it runs no candidate code and never touches CUDA (a context created before fork is
unusable in the child). Each forked child enters its sandbox (session, limits, cgroup, network
namespace, uid) before running its target, exactly as a freshly started process would.
Requests arrive on a SOCK_SEQPACKET socket with their file descriptors; the zygote reaps its
children and reports their exit status on request.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # availability checks must not init CUDA


def _child(req: dict, fds: list[int], ctl_fd: int) -> int:
    from .sandbox import enter_sandbox

    setup = req["setup"]
    os.setsid()
    os.close(ctl_fd)
    log_fd = fds[-1]
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(devnull)
    os.close(log_fd)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    os.chdir(setup["workdir"])
    os.environ.clear()
    os.environ.update(setup["env"])
    enter_sandbox(setup)
    if req["target"] == "worker":
        from . import worker

        return worker.main(fds[0], fds[1], *[int(a) for a in req["args"]])
    if req["target"] == "builds.job":
        from .builds import job

        return job.main(*[str(a) for a in req["args"]])
    return 2


def main(ctl_fd: int) -> int:
    import torch  # noqa: F401  (the point: import once, fork many)
    import torch.utils._python_dispatch  # noqa: F401
    import torch.utils.cpp_extension  # noqa: F401

    from . import worker
    from .builds import job  # noqa: F401  (imported once, for every fork)

    worker.warm_dispatch(torch)  # every forked worker inherits it

    if torch.cuda.is_initialized():  # would poison every child
        return 1
    import threading

    if threading.active_count() > 1:
        # fork() copies only the calling thread; a lock held by another thread at that moment
        # stays locked forever in the child. Refuse, and the judge starts fresh interpreters.
        # (`import torch` starts one idle native thread of its own; that one is accepted.)
        return 3
    sock = socket.socket(fileno=ctl_fd)
    statuses: dict[int, int] = {}
    children: set[int] = set()

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            statuses[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            if len(statuses) > 4096:
                for old in list(statuses)[:1024]:
                    del statuses[old]

    while True:
        reap()
        ready, _, _ = select.select([sock], [], [], 0.05)
        if not ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 16)
        except OSError:
            return 0
        if not data:
            return 0
        try:
            req = json.loads(data)
            op = req.get("op")
            if op == "hello":
                reply = {"ok": True}
            elif op == "status":
                reap()
                pid = int(req["pid"])
                reply = {"returncode": statuses.get(pid)} if pid not in children else {"returncode": None}
            elif op == "spawn":
                pid = os.fork()
                if pid == 0:
                    code = 70
                    try:
                        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                        code = _child(req, fds, ctl_fd)
                    except SystemExit as exc:
                        code = exc.code if isinstance(exc.code, int) else 1
                    except BaseException:
                        import traceback

                        traceback.print_exc()
                        code = 70
                    finally:
                        try:
                            sys.stdout.flush()
                            sys.stderr.flush()
                        finally:
                            os._exit(code if isinstance(code, int) else 1)
                children.add(pid)
                reply = {"pid": pid}
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as exc:  # a malformed request from the judge itself; report, keep serving
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(reply).encode())


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
