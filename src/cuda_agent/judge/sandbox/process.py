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
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from cuda_agent.host import exit_description

from .cgroups import (_count_user_procs, _kill_cgroup, _mntns, _netns, _pids_cgroup, _pids_of_uid, _proc_status,
                      _session_pids)
from .common import PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, SandboxError, _libc, is_root
from .landlock import install_landlock, landlock_plan, landlock_use
from .namespaces import CLONE_NEWNET, CLONE_NEWNS, _enter_view, namespaces_problem, private_view
from .seccomp import seccomp_mode
from .zygote_client import Zygote, _ZygoteChild

ENV_KEEP = ("PATH", "LANG", "LC_ALL", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
            "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
            "CC", "CXX", "OMP_NUM_THREADS", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")



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
    target: str | None = None            # "worker" or "builds.job": what a zygote fork runs
    target_args: list = field(default_factory=list)
    hide: tuple[Path, ...] = ()          # judge folders to cover (besides the work root and default cache)
    landlock: str = "auto"             # "on", "off" or "auto": on where the judge is not root (see landlock_use)
    expose: tuple[Path, ...] = ()        # judge folders shown read-only where hidden (a build's precompiled headers)


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
            view = private_view(spec.workdir, spec.hide, self.uid is not None, spec.expose)
        self.landlock = landlock_use(spec.landlock)
        self.cgroup = _pids_cgroup(spec.max_procs)
        # The cgroup goes with this object however it ends: cleanup() runs the finaliser, and so
        # does garbage collection of an object never cleaned up, or the interpreter's exit. A
        # start that fails (a zygote that died, a fork refused) removes it at once.
        self._release_cgroup = weakref.finalize(self, _kill_cgroup, self.cgroup) if self.cgroup else None
        try:
            self._start(spec, view, zygote)
        except BaseException:
            if self._release_cgroup is not None:
                self._release_cgroup()
            raise

    def _start(self, spec: SandboxSpec, view: dict | None, zygote: "Zygote | None") -> None:
        if self.uid is not None:
            _chown_tree(spec.workdir, self.uid)
        env = sandbox_env(spec.workdir)
        env.update(spec.env)
        self.env = env
        self.setup = {"workdir": str(spec.workdir), "uid": self.uid, "cgroup": self.cgroup,
                      "max_file_mb": spec.max_file_mb, "max_procs": spec.max_procs,
                      "address_space_mb": spec.address_space_mb, "isolate_network": spec.isolate_network,
                      "view": view,
                      "landlock": landlock_plan(spec.workdir, spec.hide, spec.expose) if self.landlock else None}
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

    def pids(self) -> list[int]:
        """The processes of this sandbox: its session's, or every one of its uid."""
        return _session_pids(self.pid, self.uid)

    def rss_mb(self) -> float:
        total = 0
        for pid in self.pids():
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
        return exit_description(self.proc.poll())

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
        try:
            self.kill()
        finally:  # a kill that raised (its zygote gone, say) still takes the cgroup and all inside
            if self._release_cgroup is not None:
                self._release_cgroup()
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


_PROTECTED = False


def _protect_judge() -> None:
    """The judge holds the reference outputs: reading /proc/<pid>/mem needs ptrace access, which a
    non-dumpable process grants to no one without CAP_SYS_PTRACE, whatever their uid."""
    global _PROTECTED
    if not _PROTECTED:
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        _PROTECTED = True


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


def new_workdir(parent: Path, prefix: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o700)
    return path


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
