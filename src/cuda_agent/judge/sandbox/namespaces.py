"""The file system a sandboxed process sees (root only: a private mount namespace, and a network
namespace with no interfaces), and the judge's folders it must not see."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from .common import SandboxError, _libc

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18


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

        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # .../cuda_agent
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


def private_view(workdir: Path, hide: tuple[Path, ...], drop_uid: bool, expose: tuple[Path, ...] = ()) -> dict:
    """The mount plan of one sandboxed process (computed in the judge, applied by `_enter_view`).
    `expose`: folders of the judge the process reads (a build's precompiled headers, in the judge's
    cache folder), bound back read-only where a covered folder would hide them."""
    workdir_s = os.path.realpath(workdir)
    hidden: list[str] = []
    for h in (*hide, work_root_dir(), _default_cache_dir()):
        real = os.path.realpath(h)
        if os.path.isdir(real) and real not in ("/", workdir_s) and real not in hidden:
            hidden.append(real)
    # outermost first, and none inside another (a tmpfs over the outer one hides them already)
    hidden = [h for h in sorted(hidden) if not any(h.startswith(o + "/") for o in hidden if o != h)]
    barriers: list[str] = []
    shown: list[str] = []

    def show(p: str) -> None:
        # under a covered judge folder (a cache that holds the venv), or past a folder the dropped
        # uid cannot enter: bound back read-only
        under_hidden = any(p.startswith(h + "/") for h in hidden)
        b = _barrier(p) if drop_uid else None
        if under_hidden or b is not None:
            shown.append(p)
        if b is not None and not under_hidden and b not in barriers:
            barriers.append(b)

    for p in runtime_paths():
        show(p)
    if drop_uid:
        wb = _barrier(workdir_s)
        if wb is not None and not any(wb == h or wb.startswith(h + "/") for h in hidden) and wb not in barriers:
            barriers.append(wb)
    # The judge's precompiled binding headers (made by the judge, read-only to every sandbox uid)
    # stay visible to builds, which link against them. Passed in, not guessed: they live in the
    # judge's cache folder, which need not be the default one.
    for path in expose:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in shown:
            show(real)
    barriers = [b for b in sorted(barriers) if not any(b.startswith(o + "/") for o in barriers if o != b)]
    # a barrier inside a hidden folder is covered by it; a hidden folder inside a barrier is gone already
    hidden = [h for h in hidden if not any(h.startswith(b + "/") for b in barriers)]
    barriers = [b for b in barriers if not any(b == h or b.startswith(h + "/") for h in hidden)]
    covered = any(workdir_s.startswith(t + "/") for t in (*hidden, *barriers))
    return {"expose": shown, "barriers": barriers, "hide": hidden, "workdir": workdir_s if covered else None}


def _default_cache_dir() -> Path:
    from ..config import default_cache_dir

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


def work_root_dir() -> Path:
    """The judge's working folder (`config.default_work_root`), made traversable, not listable, by sandbox uids."""
    from ..config import default_work_root
    root = default_work_root()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)
    return root
