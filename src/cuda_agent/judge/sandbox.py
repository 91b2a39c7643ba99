"""Processes for untrusted code: the candidate's Python/C++ and the compiler run on its sources.

What is isolated:
- its own session and process group, killed as a whole (and, when the judge runs as root, every
  process of the sandbox uid, so a child that calls setsid() cannot escape);
- a scrubbed environment (no API keys, no PYTHONPATH; only what the toolchain needs);
- rlimits: no core files, bounded file size, open files and (for a non-root sandbox uid) processes;
  address space on the CPU backend (CUDA reserves huge virtual ranges, so not there);
- when root: a distinct uid/gid (cannot write the judge's files or read root-only files) and a new
  network namespace with no interfaces (no network);
- the parent's death kills it (PR_SET_PDEATHSIG);
- a resident-memory watchdog in the parent.

What is not isolated: reads of world-readable files, the GPU itself (shared with the judge's own
context; device memory is per process), CPU time of other processes (only wall-clock limits).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNET = 0x40000000

ENV_KEEP = ("PATH", "LANG", "LC_ALL", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
            "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
            "CC", "CXX", "OMP_NUM_THREADS", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")


def is_root() -> bool:
    return os.geteuid() == 0


@dataclass
class SandboxSpec:
    argv: list[str]
    workdir: Path
    uid: int | None = None              # used only when the judge runs as root
    pass_fds: tuple[int, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    address_space_mb: int | None = None
    max_file_mb: int = 2048
    max_procs: int = 512
    isolate_network: bool = True
    target: str | None = None            # "worker" or "buildjob": what a zygote fork runs
    target_args: list = field(default_factory=list)


class Sandboxed:
    """A running sandboxed process. Always `cleanup()` it (idempotent).

    Started either as a fresh interpreter (`spec.argv`) or, when a `Zygote` is given and the spec
    names a `target`, forked from a trusted process that has already imported torch.
    """

    def __init__(self, spec: SandboxSpec, zygote: "Zygote | None" = None):
        self.spec = spec
        spec.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = spec.workdir / "process.log"
        self.uid = spec.uid if (is_root() and spec.uid is not None and sandbox_uid_usable()) else None
        self.cgroup = _pids_cgroup(spec.max_procs)
        if self.uid is not None:
            _chown_tree(spec.workdir, self.uid)
        env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
        # A sandbox uid has no passwd entry: name it, and keep every cache inside the workdir.
        env.update({"HOME": str(spec.workdir), "TMPDIR": str(spec.workdir), "PYTHONNOUSERSITE": "1",
                    "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "USER": "cuda-agent-sandbox",
                    "LOGNAME": "cuda-agent-sandbox", "TORCHINDUCTOR_CACHE_DIR": str(spec.workdir / "inductor"),
                    "TRITON_CACHE_DIR": str(spec.workdir / "triton"), "XDG_CACHE_HOME": str(spec.workdir / "cache")})
        env.update(spec.env)
        self.env = env
        self.setup = {"workdir": str(spec.workdir), "uid": self.uid, "cgroup": self.cgroup,
                      "max_file_mb": spec.max_file_mb, "max_procs": spec.max_procs,
                      "address_space_mb": spec.address_space_mb, "isolate_network": spec.isolate_network}
        self.isolation: list[str] = ["own session", "scrubbed env", "rlimits", "parent-death kill"]
        if zygote is not None and spec.target is not None and zygote.usable():
            log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                if self.uid is not None:
                    os.fchown(log_fd, self.uid, self.uid)
                pid = zygote.spawn(spec.target, spec.target_args, (*spec.pass_fds, log_fd),
                                   dict(self.setup, env=env))
            finally:
                os.close(log_fd)
            self.proc = _ZygoteChild(zygote, pid)
            self.isolation.append("forked from a clean zygote")
        else:
            log = open(self.log_path, "wb")
            try:
                self.proc = subprocess.Popen(
                    spec.argv, cwd=spec.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    pass_fds=spec.pass_fds, start_new_session=True, close_fds=True,
                    preexec_fn=lambda: enter_sandbox(self.setup))
            finally:
                log.close()
        self.pid = self.proc.pid
        self.started = time.monotonic()
        self._cleaned = False
        self.reset_disk_baseline()
        if self.uid is not None:
            self.isolation.append(f"uid {self.uid}")
        if self.cgroup is not None:
            self.isolation.append(f"pids cgroup (max {spec.max_procs})")

    def reset_disk_baseline(self) -> None:
        """Count disk use from now (a process started ahead of its task must not be charged with
        what the judge wrote meanwhile)."""
        self._disk_free0 = _free_mb(self.spec.workdir)

    def probe_isolation(self) -> None:
        """Record network and system-call isolation as the kernel reports them (once running)."""
        if seccomp_mode(self.pid) == 2 and "seccomp" not in self.isolation:
            self.isolation.append("seccomp")
        if self.spec.isolate_network and is_root() and _netns(self.pid) not in (None, _netns(os.getpid())):
            if "no network" not in self.isolation:
                self.isolation.append("no network")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_mb(self) -> float:
        total = 0
        for pid in _session_pids(self.pid, self.uid):
            try:
                with open(f"/proc/{pid}/statm") as fh:
                    total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError, IndexError):
                pass
        return total / (1 << 20)

    def disk_used_mb(self) -> float:
        """Disk space consumed since the start, on the workdir's and /tmp's file systems. It counts
        everyone's writes, so the limit is generous; it exists to stop a disk-filling candidate."""
        return max(0.0, self._disk_free0 - _free_mb(self.spec.workdir))

    def exit_description(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with status {code}"

    def log_tail(self, limit: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - limit))
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        for _ in range(3):
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if self.uid is not None:
                for pid in _pids_of_uid(self.uid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                continue
            if self.uid is None or not _pids_of_uid(self.uid):
                break

    def cleanup(self, remove_workdir: bool = True) -> None:
        # Once only: killing "every process of this uid" again later would hit a process started
        # since under the same uid (the judge's next worker).
        if self._cleaned:
            return
        self._cleaned = True
        self.kill()
        if self.cgroup is not None:
            _kill_cgroup(self.cgroup)
        if self.uid is not None:
            # files the sandbox uid left in shared temporary folders
            for tmp in ("/tmp", "/dev/shm", "/var/tmp"):
                try:
                    entries = list(os.scandir(tmp))
                except OSError:
                    continue
                for entry in entries:
                    try:
                        if entry.stat(follow_symlinks=False).st_uid == self.uid:
                            _remove(Path(entry.path))
                    except OSError:
                        pass
        if remove_workdir:
            _remove(self.spec.workdir)


def enter_sandbox(setup: dict) -> None:
    """Runs in the new process before any untrusted code: limits, namespaces, then the uid drop."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if setup.get("cgroup"):
        try:
            with open(os.path.join(setup["cgroup"], "cgroup.procs"), "w") as fh:
                fh.write(str(os.getpid()))
        except OSError:
            pass
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    fsize = setup["max_file_mb"] << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    if setup.get("address_space_mb"):
        limit = setup["address_space_mb"] << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    uid = setup.get("uid")
    if is_root():
        if setup.get("isolate_network"):
            _libc.unshare(CLONE_NEWNET)  # best effort: containers may forbid it
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            resource.setrlimit(resource.RLIMIT_NPROC, (setup["max_procs"], setup["max_procs"]))
            os.setuid(uid)
    else:
        # RLIMIT_NPROC counts all of the user's processes; leave room for what already runs.
        soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        want = _count_user_procs() + setup["max_procs"]
        if hard == resource.RLIM_INFINITY or want <= hard:
            resource.setrlimit(resource.RLIMIT_NPROC, (want, hard))
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


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


_UID_USABLE: bool | None = None


def sandbox_uid_usable() -> bool:
    """A different uid can run this interpreter and import torch and this package only if every
    folder above them is searchable by others (not so for a Python under /root)."""
    global _UID_USABLE
    if _UID_USABLE is None:
        import torch

        paths = [os.path.realpath(sys.executable), os.path.dirname(os.path.realpath(torch.__file__)),
                 os.path.dirname(os.path.dirname(os.path.realpath(__file__)))]
        _UID_USABLE = all(_world_reachable(p) for p in paths)
    return _UID_USABLE


def _world_reachable(path: str) -> bool:
    parts = Path(path).parts
    for i in range(1, len(parts) + 1):
        p = os.path.join(*parts[:i])
        try:
            mode = os.stat(p).st_mode
        except OSError:
            return False
        if os.path.isdir(p) and not mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o004) or os.path.isdir(path)


def _pids_cgroup(max_procs: int) -> str | None:
    """A fresh pids cgroup (v2, else v1) capping the process count, when this process may make one."""
    if not is_root():
        return None
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified"):
        if not os.path.exists(os.path.join(base, "pids.max" if base.endswith("pids") else "cgroup.controllers")) \
                and not os.path.exists(os.path.join(base, "cgroup.procs")):
            continue
        path = os.path.join(base, f"cuda-agent-{os.getpid()}-{time.monotonic_ns()}")
        try:
            os.mkdir(path)
            with open(os.path.join(path, "pids.max"), "w") as fh:
                fh.write(str(max_procs))
            return path
        except OSError:
            try:
                os.rmdir(path)
            except OSError:
                pass
    return None


def _kill_cgroup(path: str) -> None:
    """Kill every process of the cgroup now; remove the cgroup once they are gone. Removal waits
    for the kernel to finish tearing the processes down (a GPU context takes a while), so it
    happens in the background: the processes are already dead, nothing is left to wait for."""
    if not _kill_cgroup_once(path):
        threading.Thread(target=_reap_cgroup, args=(path,), daemon=True).start()


def _kill_cgroup_once(path: str) -> bool:
    try:
        with open(os.path.join(path, "cgroup.procs")) as fh:
            pids = [int(x) for x in fh.read().split()]
    except OSError:
        pids = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.rmdir(path)
        return True
    except OSError:
        return False


def _reap_cgroup(path: str) -> None:
    for _ in range(200):
        time.sleep(0.05)
        if _kill_cgroup_once(path) or not os.path.isdir(path):
            return


def _free_mb(path: Path) -> float:
    try:
        return shutil.disk_usage(path).free / (1 << 20)
    except OSError:
        return 0.0


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            pass


def _chown_tree(root: Path, uid: int) -> None:
    os.chown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            try:
                os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
            except OSError:
                pass


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _proc_status(pid: str) -> dict[str, str]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                out[key] = value.strip()
    except OSError:
        pass
    return out


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _proc_status(name)
            if st.get("Uid", "").split()[:1] == [str(uid)]:
                pids.append(int(name))
    return pids


def _session_pids(sid: int, uid: int | None) -> list[int]:
    if uid is not None:
        return _pids_of_uid(uid)
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getsid(int(name)) == sid:
                    pids.append(int(name))
            except OSError:
                pass
    return pids


def _count_user_procs() -> int:
    uid = str(os.getuid())
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit() and _proc_status(name).get("Uid", "").split()[:1] == [uid]:
            n += 1
    return n


def python_argv(module: str, *args: str) -> list[str]:
    # -I: isolated mode (no PYTHONPATH, no user site, no cwd on sys.path); -S is not used so the
    # installed packages (torch, this package) stay importable.
    return [sys.executable, "-I", "-m", module, *args]


def work_root_dir() -> Path:
    """The judge's working folder (builds, candidate runs): CUDA_AGENT_WORK, or one per user under
    /var/tmp. Traversable but not listable by the sandbox uids."""
    root = Path(os.environ.get("CUDA_AGENT_WORK", f"/var/tmp/cuda-agent-{os.geteuid()}"))
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)
    return root


def new_workdir(parent: Path, prefix: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o700)
    return path


# ---------------------------------------------------------------------------------------------
# seccomp: what a candidate process may ask of the kernel once its harness is set up

_AUDIT_ARCH_X86_64 = 0xC000003E
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_DENY_X86_64 = {
    57: "fork", 58: "vfork", 59: "execve", 322: "execveat", 101: "ptrace", 310: "process_vm_readv",
    311: "process_vm_writev", 200: "tkill", 272: "unshare", 308: "setns", 165: "mount", 155: "pivot_root",
    161: "chroot", 169: "reboot", 246: "kexec_load", 320: "kexec_file_load", 175: "init_module",
    313: "finit_module", 321: "bpf", 298: "perf_event_open", 323: "userfaultfd", 425: "io_uring_setup",
    317: "seccomp",
}


def install_seccomp() -> bool:
    """Forbid new processes (threads stay allowed), exec, ptrace and cross-process memory access,
    signals to other processes, non-local sockets and namespace/module/BPF tricks, in every thread
    of this process. Returns False where unsupported (not x86-64, or the kernel refuses)."""
    import platform
    import struct

    if platform.machine() != "x86_64":
        return False
    pid = os.getpid()
    prog: list[tuple[int, int, int, int]] = []

    def ins(code, jt, jf, k):
        prog.append((code, jt, jf, k))

    load_nr = (_LD_ABS, 0, 0, 0)
    ins(_LD_ABS, 0, 0, 4)                                  # arch
    ins(_JEQ, 1, 0, _AUDIT_ARCH_X86_64)
    ins(_RET, 0, 0, _RET_ERRNO | 1)                        # another ABI: refuse
    prog.append(load_nr)
    ins(_JGE, 0, 1, 0x40000000)                            # x32 system calls
    ins(_RET, 0, 0, _RET_ERRNO | 1)
    for nr in sorted(_DENY_X86_64):
        ins(_JEQ, 0, 1, nr)
        ins(_RET, 0, 0, _RET_ERRNO | 1)                    # EPERM
    ins(_JEQ, 0, 1, 435)                                   # clone3: glibc then falls back to clone
    ins(_RET, 0, 0, _RET_ERRNO | 38)                       # ENOSYS
    ins(_JEQ, 0, 4, 56)                                    # clone: threads only
    ins(_LD_ABS, 0, 0, 16)
    ins(_JSET, 0, 1, 0x00010000)                           # CLONE_THREAD
    ins(_RET, 0, 0, _RET_ALLOW)
    ins(_RET, 0, 0, _RET_ERRNO | 1)
    prog.append(load_nr)
    for nr in (62, 234):                                   # kill, tgkill: only this process (or its group)
        ins(_JEQ, 0, 5, nr)
        ins(_LD_ABS, 0, 0, 16)
        ins(_JEQ, 2, 0, pid)
        ins(_JEQ, 1, 0, 0)
        ins(_RET, 0, 0, _RET_ERRNO | 1)
        ins(_RET, 0, 0, _RET_ALLOW)
        prog.append(load_nr)
    ins(_JEQ, 0, 4, 41)                                    # socket: AF_UNIX only
    ins(_LD_ABS, 0, 0, 16)
    ins(_JEQ, 1, 0, 1)
    ins(_RET, 0, 0, _RET_ERRNO | 13)                       # EACCES
    ins(_RET, 0, 0, _RET_ALLOW)
    ins(_RET, 0, 0, _RET_ALLOW)

    raw = b"".join(struct.pack("=HBBI", *i) for i in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog), ctypes.addressof(buf))
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, SYS_seccomp = 1, 1, 317
    rc = _libc.syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(fprog))
    return rc == 0


def seccomp_mode(pid: int) -> int:
    """The kernel's word on a process's seccomp mode (2 = filter)."""
    return int(_proc_status(str(pid)).get("Seccomp", "0") or 0)


def pin_threads(pid: int, cpus: list[int] | None) -> None:
    """Move every thread of a process onto `cpus` (affinity is per thread; new threads inherit it)."""
    if not cpus:
        return
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread ended, or the process is gone: nothing to move
            pass
