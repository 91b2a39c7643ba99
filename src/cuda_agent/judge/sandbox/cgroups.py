"""The kernel's books on processes: pids cgroups (a cap on the number of processes, and a way to
kill all of them) and what /proc says of a process (uid, namespaces, session, threads)."""

from __future__ import annotations

import atexit
import os
import re
import signal
import threading
import time

from .common import is_root


_swept: set[str] = set()   # the cgroup folders whose stale entries this process has removed


def _sweep_stale(base: str) -> None:
    """Remove the cgroups that judge processes now gone left in `base`: one killed outright (its
    reaper threads and exit hook never ran) leaves its cgroups until reboot. Only empty ones can
    be removed (rmdir refuses the others), only those whose maker's process id is free now (a
    process that took the id since is left alone, its cgroups with it) and only those made over a
    minute ago (a judge of another pid namespace, whose ids this one cannot see, fills a new
    cgroup within milliseconds)."""
    now = time.monotonic_ns()
    for name in os.listdir(base):
        match = re.fullmatch(r"cuda-agent-(\d+)-(\d+)", name)
        if match is None or os.path.exists(f"/proc/{match.group(1)}") or now - int(match.group(2)) < 60e9:
            continue
        try:
            os.rmdir(os.path.join(base, name))
        except OSError:
            pass


def _pids_cgroup(max_procs: int) -> str | None:
    """A fresh pids cgroup (v2, else v1) capping the process count, when this process may make one."""
    if not is_root():
        return None
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified"):
        if not os.path.exists(os.path.join(base, "pids.max" if base.endswith("pids") else "cgroup.controllers")) \
                and not os.path.exists(os.path.join(base, "cgroup.procs")):
            continue
        if base not in _swept:
            _swept.add(base)
            try:
                _sweep_stale(base)
            except OSError:   # the folder cannot be listed: nothing to sweep
                pass
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


# cgroups killed but not yet removed: the background reaper's, and those it gave up on
_unreaped: set[str] = set()
_unreaped_lock = threading.Lock()


def _kill_cgroup(path: str) -> None:
    """Kill every process of the cgroup now; remove the cgroup once they are gone. Removal waits
    for the kernel to finish tearing the processes down (a GPU context takes a while), so it
    happens in the background: the processes are already dead, nothing is left to wait for."""
    if not _kill_cgroup_once(path):
        with _unreaped_lock:
            _unreaped.add(path)
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


def _removed(path: str) -> bool:
    """Whether the cgroup is gone now (anything still inside killed first)."""
    return _kill_cgroup_once(path) or not os.path.isdir(path)


def _reap_cgroup(path: str, limit_s: float = 600.0) -> None:
    """Retry the removal, soon at first, then every two seconds for up to `limit_s`. Teardown
    usually takes milliseconds; a cgroup given up on stays until the exit hook below."""
    deadline = time.monotonic() + limit_s
    wait = 0.05
    while time.monotonic() < deadline:
        time.sleep(wait)
        if _removed(path):
            with _unreaped_lock:
                _unreaped.discard(path)
            return
        wait = min(wait * 1.5, 2.0)


@atexit.register
def _reap_at_exit(limit_s: float = 10.0) -> None:
    """At exit, the cgroups still waiting for removal get another `limit_s`: the reaper threads
    are daemons and die with the process, and a cgroup left behind stays until reboot (a judge
    that ran for days left hundreds, and the kernel's count of cgroups is finite)."""
    deadline = time.monotonic() + limit_s
    while True:
        with _unreaped_lock:
            left = [p for p in _unreaped if not _removed(p)]
            _unreaped.intersection_update(left)
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.05)


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
