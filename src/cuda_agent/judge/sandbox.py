"""Processes for untrusted code: the candidate's Python/C++ and the compiler run on its sources.

What is isolated:
- its own session and process group, killed as a whole (and, when the judge runs as root, every
  process of the sandbox uid, so a child that calls setsid() cannot escape);
- a scrubbed environment (no API keys, no PYTHONPATH; only what the toolchain needs);
- rlimits: no core files, bounded file size, open files and (for a non-root sandbox uid) processes;
  address space on the CPU backend (CUDA reserves huge virtual ranges, so not there);
- when root: a distinct uid/gid (cannot write the judge's files, read root-only files or, not being
  allowed to ptrace it, read the judge's memory through /proc/<pid>/mem), a new network namespace
  with no interfaces (no network) and a new mount namespace: the judge's cache and work folders are
  covered by empty read-only tmpfs (only the process's own workdir shows through), and where the
  interpreter or the packages live under a folder other users cannot enter (a Python under /root),
  that folder is replaced by a tmpfs exposing only those paths, bound read-only, so the uid drop
  works there too. Each of these is required: a process for which one cannot be set up never
  runs (SandboxError), and the judge checks the kernel's record of the result (`isolation_gaps`);
- the parent's death kills it (PR_SET_PDEATHSIG, set again after the uid drop, which clears it);
- a resident-memory watchdog in the parent.
- Landlock (`JudgeConfig.landlock`; by default on the CPU backend where the judge is not root and
  the kernel has it): the kernel confines the file system for every way in, C and C++ included,
  which the audit hook does not see: reads anywhere but the judge's folders (its cache and work
  root; what the process needs from them, its own workdir and the runtime, stays readable), writes
  only in the workdir and to device nodes (not /dev/shm); no signals to, or abstract sockets of,
  processes outside it.
A judge that is not root keeps the reduced isolation (same uid, shared network and mounts) and says
so in every verdict (`Verdict.reduced_isolation`); it makes itself non-dumpable so that a candidate
of its own uid cannot read its memory either, and Landlock (where the kernel has it) keeps such a
candidate out of the judge's files and every file outside its workdir.

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
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18


class SandboxError(RuntimeError):
    """The isolation a sandboxed process needs cannot be set up on this host (never the candidate's fault)."""

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
    hide: tuple[Path, ...] = ()          # judge folders to cover (besides the work root and default cache)
    landlock: str = "auto"             # "on", "off" or "auto": on where the judge is not root (see landlock_use)


class Sandboxed:
    """A running sandboxed process. Always `cleanup()` it (idempotent).

    Started either as a fresh interpreter (`spec.argv`) or, when a `Zygote` is given and the spec
    names a `target`, forked from a trusted process that has already imported torch.
    """

    def __init__(self, spec: SandboxSpec, zygote: "Zygote | None" = None):
        self.spec = spec
        spec.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = spec.workdir / "process.log"
        _protect_judge()
        self.uid = spec.uid if (is_root() and spec.uid is not None) else None
        view = None
        if is_root():
            # Checked here, in the judge, so that a host that cannot isolate gets a clear error
            # instead of a process that dies half set up.
            problem = namespaces_problem(spec.isolate_network)
            if problem:
                raise SandboxError(problem)
            view = private_view(spec.workdir, spec.hide, self.uid is not None)
        self.landlock = landlock_use(spec.landlock)
        self.cgroup = _pids_cgroup(spec.max_procs)
        if self.uid is not None:
            _chown_tree(spec.workdir, self.uid)
        env = sandbox_env(spec.workdir)
        env.update(spec.env)
        self.env = env
        self.setup = {"workdir": str(spec.workdir), "uid": self.uid, "cgroup": self.cgroup,
                      "max_file_mb": spec.max_file_mb, "max_procs": spec.max_procs,
                      "address_space_mb": spec.address_space_mb, "isolate_network": spec.isolate_network,
                      "view": view, "landlock": landlock_plan(spec.workdir, spec.hide) if self.landlock else None}
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
        if self.landlock:
            self.isolation.append("landlock")

    def reset_disk_baseline(self) -> None:
        """Count disk use from now (a process started ahead of its task must not be charged with
        what the judge wrote meanwhile)."""
        self._disk_free0 = _free_mb(self.spec.workdir)

    def required_isolation(self) -> dict:
        """What the process must find in force before it loads untrusted code (it checks itself)."""
        return {"uid": self.uid, "netns": _netns(os.getpid()) if is_root() and self.spec.isolate_network else None}

    def probe_isolation(self) -> None:
        """Record network and system-call isolation as the kernel reports them (once running)."""
        if seccomp_mode(self.pid) == 2 and "seccomp" not in self.isolation:
            self.isolation.append("seccomp")
        if self.spec.isolate_network and is_root() and _netns(self.pid) not in (None, _netns(os.getpid())):
            if "no network" not in self.isolation:
                self.isolation.append("no network")
        if is_root() and _mntns(self.pid) not in (None, _mntns(os.getpid())) and "private mounts" not in self.isolation:
            self.isolation.append("private mounts")

    def isolation_gaps(self, audit_hook: bool, confined: bool | None = None) -> tuple[list[str], list[str]]:
        """(missing, reduced) for a process that runs untrusted code, from the kernel's record of it.

        `missing`: what should be in force and is not; a verdict with any cannot be trusted and
        fails (the host is at fault, not the candidate). `reduced`: what a judge that is not root
        cannot do at all (documented reduced isolation, reported in the verdict). `confined`: what
        the process found when it tried to list the folder above its workdir (`landlock_confined`),
        where Landlock was asked for."""
        missing: list[str] = []
        if seccomp_mode(self.pid) != 2:
            missing.append("seccomp filter (the kernel reports none for the candidate process; needs Linux "
                           "x86-64 with seccomp filters and no_new_privs)")
        if not audit_hook:
            missing.append("audit hook (the candidate process did not confirm it installed one)")
        if self.landlock and confined is not True:
            missing.append("Landlock (the candidate process could still read the judge's work folder)")
        if not is_root():
            reduced = ["separate uid (the judge is not root)", "network namespace (the judge is not root)",
                       "mount namespace (the judge is not root)"]
            if not self.landlock:
                reduced.append("file system confinement (" + (
                    "Landlock not used: JudgeConfig.landlock is 'off', or 'auto' on CUDA" if self.spec.landlock == "off"
                    else "the kernel has no Landlock") + ")")
            return missing, reduced
        if self.spec.uid is not None:
            ids = _proc_status(str(self.pid)).get("Uid", "").split()
            if not ids or any(x != str(self.spec.uid) for x in ids):
                missing.append(f"uid drop (the candidate process runs as uid {ids[:1]}, not {self.spec.uid}; "
                               f"needs root and mount namespaces: run the judge as root outside a "
                               f"restricted container, or give the container CAP_SYS_ADMIN)")
        if self.spec.isolate_network and _netns(self.pid) in (None, _netns(os.getpid())):
            missing.append("network namespace (unshare(CLONE_NEWNET) was refused; give the container "
                           "CAP_SYS_ADMIN or run the judge on the host)")
        return missing, []

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


def sandbox_env(workdir: Path) -> dict[str, str]:
    """The environment a sandboxed process starts with: the judge's own variables of ENV_KEEP only,
    and a home, temporary folder and caches inside `workdir`."""
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    # A sandbox uid has no passwd entry: name it, and keep every cache inside the workdir.
    env.update({"HOME": str(workdir), "TMPDIR": str(workdir), "PYTHONNOUSERSITE": "1",
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "USER": "cuda-agent-sandbox",
                "LOGNAME": "cuda-agent-sandbox", "TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor"),
                "TRITON_CACHE_DIR": str(workdir / "triton"), "XDG_CACHE_HOME": str(workdir / "cache")})
    return env


def enter_sandbox(setup: dict) -> None:
    """Runs in the new process before any untrusted code: limits, namespaces, then the uid drop.
    Raises SandboxError when a required part cannot be set up: the process must then not run."""
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
        flags = CLONE_NEWNS | (CLONE_NEWNET if setup.get("isolate_network") else 0)
        if _libc.unshare(flags) != 0:
            raise SandboxError(f"unshare(namespaces) failed: {os.strerror(ctypes.get_errno())}")
        _enter_view(setup.get("view") or {})
        if uid is not None:
            parent = os.getppid()
            os.setgroups([])
            os.setgid(uid)
            resource.setrlimit(resource.RLIMIT_NPROC, (setup["max_procs"], setup["max_procs"]))
            os.setuid(uid)
            # A change of uid clears the parent-death signal (and makes the process non-dumpable).
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)
            if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
                raise SandboxError(f"the uid drop to {uid} did not take")
    else:
        # RLIMIT_NPROC counts all of the user's processes; leave room for what already runs.
        soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        want = _count_user_procs() + setup["max_procs"]
        if hard == resource.RLIM_INFINITY or want <= hard:
            resource.setrlimit(resource.RLIMIT_NPROC, (want, hard))
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if setup.get("landlock"):
        install_landlock(setup["landlock"])  # last: the rules name the paths of the view set up above


# ---------------------------------------------------------------------------------------------
# the file system a sandboxed process sees (root only: a private mount namespace)

def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda x: None if x is None else os.fsencode(x))
    if _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"mount {source!r} on {target!r} failed: {os.strerror(err)}")


def _enter_view(view: dict) -> None:
    """In a fresh mount namespace (the caller unshared it): make every mount private (nothing done
    here reaches the host), cover the judge's folders with empty read-only tmpfs, replace folders
    other users cannot enter by a tmpfs that shows only the runtime paths (read-only binds), and
    bind the process's own workdir back where it was."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    binds: list[tuple[str, bool]] = [(p, True) for p in view.get("expose", [])]
    if view.get("workdir"):
        binds.append((view["workdir"], False))
    # Descriptors first: once a tmpfs covers a folder its contents can only be reached through them.
    fds = [(os.open(path, os.O_PATH | os.O_CLOEXEC), path, ro) for path, ro in binds]
    covers = list(view.get("barriers", [])) + list(view.get("hide", []))
    for top in covers:
        _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=4096")
    for fd, path, ro in fds:
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)
        if ro:
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
        os.close(fd)
    for top in covers:
        _mount(None, top, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if view.get("workdir"):
        os.chdir(view["workdir"])  # the cwd must be the bound folder, not the covered original


_RUNTIME_PATHS: list[str] | None = None


def runtime_paths() -> list[str]:
    """What a sandboxed interpreter reads: the interpreter's prefixes, every import path, torch and
    this package (real paths, outermost only)."""
    global _RUNTIME_PATHS
    if _RUNTIME_PATHS is None:
        import torch

        here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # .../cuda_agent
        cands = [os.path.dirname(os.path.realpath(sys.executable)), sys.prefix, sys.exec_prefix,
                 sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.realpath(torch.__file__)),
                 os.path.dirname(here), *sys.path]
        for var in ("CUDA_HOME", "CUDA_PATH"):
            if os.environ.get(var):
                cands.append(os.environ[var])
        real = sorted({os.path.realpath(p) for p in cands if p and os.path.isabs(p) and os.path.exists(p)})
        real = [p if os.path.isdir(p) else os.path.dirname(p) for p in real]
        out: list[str] = []
        for p in sorted(set(real)):
            if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
                out.append(p)
        _RUNTIME_PATHS = out
    return _RUNTIME_PATHS


def _barrier(path: str) -> str | None:
    """The outermost folder above `path` that other users cannot enter."""
    parts = Path(path).parts
    for i in range(2, len(parts)):
        p = os.path.join(*parts[:i])
        try:
            if not os.stat(p).st_mode & 0o001:
                return p
        except OSError:
            return None
    return None


def private_view(workdir: Path, hide: tuple[Path, ...], drop_uid: bool) -> dict:
    """The mount plan of one sandboxed process (computed in the judge, applied by `_enter_view`)."""
    workdir_s = os.path.realpath(workdir)
    hidden: list[str] = []
    for h in (*hide, work_root_dir(), _default_cache_dir()):
        real = os.path.realpath(h)
        if os.path.isdir(real) and real not in ("/", workdir_s) and real not in hidden:
            hidden.append(real)
    # outermost first, and none inside another (a tmpfs over the outer one hides them already)
    hidden = [h for h in sorted(hidden) if not any(h.startswith(o + "/") for o in hidden if o != h)]
    barriers: list[str] = []
    expose: list[str] = []
    for p in runtime_paths():
        # under a covered judge folder (a cache that holds the venv): bound back read-only
        under_hidden = any(p.startswith(h + "/") for h in hidden)
        b = _barrier(p) if drop_uid else None
        if under_hidden or b is not None:
            expose.append(p)
        if b is not None and not under_hidden and b not in barriers:
            barriers.append(b)
    if drop_uid:
        wb = _barrier(workdir_s)
        if wb is not None and not any(wb == h or wb.startswith(h + "/") for h in hidden) and wb not in barriers:
            barriers.append(wb)
    # The judge's precompiled binding headers (made by the judge, read-only to every sandbox uid)
    # stay visible: builds link against them.
    pch = os.path.realpath(work_root_dir() / "pch")
    if os.path.isdir(pch) and any(pch.startswith(h + "/") for h in hidden):
        expose.append(pch)
    barriers = [b for b in sorted(barriers) if not any(b.startswith(o + "/") for o in barriers if o != b)]
    # a barrier inside a hidden folder is covered by it; a hidden folder inside a barrier is gone already
    hidden = [h for h in hidden if not any(h.startswith(b + "/") for b in barriers)]
    barriers = [b for b in barriers if not any(b == h or b.startswith(h + "/") for h in hidden)]
    covered = any(workdir_s.startswith(t + "/") for t in (*hidden, *barriers))
    return {"expose": expose, "barriers": barriers, "hide": hidden, "workdir": workdir_s if covered else None}


def _default_cache_dir() -> Path:
    from .config import default_cache_dir

    return default_cache_dir()


_NS_PROBLEM: dict[bool, str] = {}


def namespaces_problem(network: bool) -> str:
    """Empty when this host lets root give a process its own mount (and network) namespace; else
    what is wrong and how to fix it. Tried once, in a throw-away child."""
    if network not in _NS_PROBLEM:
        flags = CLONE_NEWNS | (CLONE_NEWNET if network else 0)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if _libc.unshare(flags) == 0 and _libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE),
                                                             None) == 0:
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        _NS_PROBLEM[network] = "" if ok else (
            f"the judge runs as root but cannot give candidate processes their own mount"
            f"{' and network' if network else ''} namespace (unshare refused), so it cannot isolate them "
            f"(separate uid, no network, judge folders hidden). Fix the host: run the judge on the host or in a "
            f"container with CAP_SYS_ADMIN (e.g. docker --cap-add SYS_ADMIN --security-opt seccomp=unconfined), "
            f"or run it as an unprivileged user (reduced isolation, reported in every verdict).")
    return _NS_PROBLEM[network]


_SECCOMP_PROBLEM: str | None = None


def seccomp_problem() -> str:
    """Empty when this host can install the candidate's seccomp filter; else what is wrong. Tried
    once, in a throw-away child (a filter cannot be removed again)."""
    global _SECCOMP_PROBLEM
    if _SECCOMP_PROBLEM is None:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = 0 if install_seccomp() else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        import platform

        _SECCOMP_PROBLEM = "" if ok else (
            f"this host cannot confine candidate processes with the judge's seccomp filter (machine "
            f"{platform.machine()}; the filter is written for x86-64 and needs seccomp filters and "
            f"no_new_privs, which some containers forbid): judge on Linux x86-64, in a container that allows "
            f"seccomp (e.g. docker's default profile, not --security-opt seccomp=... with a deny of seccomp())")
    return _SECCOMP_PROBLEM


_PROTECTED = False


def _protect_judge() -> None:
    """The judge holds the reference outputs: reading /proc/<pid>/mem needs ptrace access, which a
    non-dumpable process grants to no one without CAP_SYS_PTRACE, whatever their uid."""
    global _PROTECTED
    if not _PROTECTED:
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        _PROTECTED = True


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


def _mntns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
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
    """The judge's working folder (`config.default_work_root`), made traversable, not listable, by sandbox uids."""
    from .config import default_work_root
    root = default_work_root()
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


# ---------------------------------------------------------------------------------------------
# Landlock: the kernel's confinement of the file system, for every way in (the audit hook sees only
# Python's; a C++ fopen or libtorch's own file mapping passes it). Unprivileged, so it is what keeps
# a candidate of the judge's own uid out of the judge's files.

_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_LL_REFER, _LL_TRUNCATE = 1 << 13, 1 << 14
_LL_FILE_RIGHTS = _LL_EXECUTE | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE  # what a rule on a file may hold
_LL_READ = _LL_EXECUTE | _LL_READ_FILE | _LL_READ_DIR
_LL_SCOPES = 0b11  # ABI 6: abstract unix sockets and signals of processes outside the domain
# Device nodes the process opens for writing (the GPU's among them); shared-memory folders are not
# devices but channels between processes, so they stay read-only.
_LL_DEV_EXCEPT = ("/dev/shm", "/dev/mqueue")


class _LandlockRulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _LandlockPathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_LANDLOCK_ABI: int | None = None


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers (0: none, or switched off)."""
    global _LANDLOCK_ABI
    if _LANDLOCK_ABI is None:
        version = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
        _LANDLOCK_ABI = max(int(version), 0)
    return _LANDLOCK_ABI


def landlock_use(mode: str) -> bool:
    """Whether a sandboxed process gets Landlock: "on" always (a kernel without it is a SandboxError,
    not a silent gap), "off" never, "auto" where the judge is not root and the kernel has it (as root,
    the uid drop and the private mounts already do its work)."""
    if mode not in ("on", "off", "auto"):
        raise ValueError(f"landlock must be 'on', 'off' or 'auto', not {mode!r}")
    if mode == "on" and landlock_abi() < 1:
        raise SandboxError("Landlock was asked for (JudgeConfig.landlock='on') but this kernel does not offer it "
                           "(Linux 5.13 or later with Landlock among its security modules: lsm=...,landlock)")
    return mode == "on" or (mode == "auto" and not is_root() and landlock_abi() >= 1)


def landlock_plan(workdir: Path, hide: tuple[Path, ...]) -> dict:
    """What a process may reach (computed in the judge, applied by `install_landlock`): the judge's
    folders of `private_view` hidden, what the runtime needs from them exposed, the workdir open."""
    view = private_view(workdir, hide, drop_uid=False)
    return {"workdir": os.path.realpath(workdir), "hide": view["hide"], "expose": view["expose"]}


def install_landlock(plan: dict) -> None:
    """Confine this process (and everything it starts) to `plan`. Raises SandboxError where the
    kernel refuses: the process must then not run."""
    abi = landlock_abi()
    if abi < 1:
        raise SandboxError("Landlock is not offered by this kernel")
    handled = (1 << 13) - 1 | (_LL_REFER if abi >= 2 else 0) | (_LL_TRUNCATE if abi >= 3 else 0)
    attr = _LandlockRulesetAttr(handled, 0, _LL_SCOPES if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # the struct as this ABI knows it
    fd = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise SandboxError(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    try:
        _landlock_allow_except(fd, "/", tuple(plan["hide"]), _LL_READ)
        for path in plan["expose"]:
            _landlock_allow(fd, path, _LL_READ)
        _landlock_allow_except(fd, "/dev", _LL_DEV_EXCEPT, (_LL_WRITE_FILE | _LL_TRUNCATE) & handled)
        _landlock_allow(fd, plan["workdir"], handled, required=True)
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise SandboxError(f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def _landlock_allow(ruleset: int, path: str, access: int, required: bool = False) -> None:
    """Allow `access` beneath `path`. A path this process cannot open is skipped (it cannot reach
    it anyway), unless `required`. Never follows a link: its target gets its own rule, or none."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if required:
            raise SandboxError(f"Landlock: cannot open {path}: {exc.strerror}") from None
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _LL_FILE_RIGHTS
        if not access:
            return
        rule = _LandlockPathBeneath(access, fd)
        if _libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1),  # PATH_BENEATH
                         ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise SandboxError(f"landlock_add_rule on {path} failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def _landlock_allow_except(ruleset: int, root: str, excluded: tuple[str, ...], access: int) -> None:
    """Allow `access` beneath `root` except beneath the `excluded` paths (real paths): Landlock only
    allows, so every folder on the way down to an excluded one is split into its entries."""
    inside = tuple(e for e in excluded if e == root or e.startswith(root.rstrip("/") + "/"))
    if not inside:
        _landlock_allow(ruleset, root, access)
        return
    if root in inside:
        return
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        _landlock_allow_except(ruleset, os.path.join(root, name), inside, access)


def landlock_confined(workdir: str) -> bool:
    """Run inside a sandboxed process: whether it is kept out of the folder that holds its workdir
    (the judge's work root, never allowed), the check the judge asks of every Landlock process."""
    try:
        os.listdir(os.path.dirname(os.path.realpath(workdir)))
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def missing_in_self(require: dict) -> list[str]:
    """Run inside a sandboxed process before untrusted code: what the judge required of its
    isolation (`Sandboxed.required_isolation`) and the kernel says is not in force."""
    missing = []
    uid = require.get("uid")
    if uid is not None and (os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid)):
        missing.append(f"uid drop (running as uid {os.getuid()}, not {uid})")
    judge_net = require.get("netns")
    if judge_net is not None and _netns(os.getpid()) in (None, judge_net):
        missing.append("network namespace (shares the judge's network)")
    if seccomp_mode(os.getpid()) != 2:
        missing.append("seccomp filter (the kernel reports none)")
    return missing


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
