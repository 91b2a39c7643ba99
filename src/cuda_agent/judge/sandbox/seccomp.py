"""seccomp: what a candidate process may ask of the kernel once its harness is set up."""

from __future__ import annotations

import ctypes
import os

from .cgroups import _proc_status
from .common import PR_SET_NO_NEW_PRIVS, _libc

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
