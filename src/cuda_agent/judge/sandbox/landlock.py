"""Landlock: the kernel's confinement of the file system, for every way in (the audit hook sees only
Python's; a C++ fopen or libtorch's own file mapping passes it). Unprivileged, so it is what keeps
a candidate of the judge's own uid out of the judge's files."""

from __future__ import annotations

import ctypes
import os
import stat
from pathlib import Path

from .common import SandboxError, _libc, is_root
from .namespaces import private_view

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


def landlock_plan(workdir: Path, hide: tuple[Path, ...], expose: tuple[Path, ...] = ()) -> dict:
    """What a process may reach (computed in the judge, applied by `install_landlock`): the judge's
    folders of `private_view` hidden, what the runtime (and `expose`) needs from them exposed, the
    workdir open."""
    view = private_view(workdir, hide, drop_uid=False, expose=expose)
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
