"""Processes for untrusted code (the candidate's Python/C++ and the compiler run on its sources),
one module per mechanism; what each isolates, and what is not isolated, is told in process.py.

- process.py: the sandboxed process (`Sandboxed`, `SandboxSpec`), its environment, rlimits and
  setup in the child (`enter_sandbox`), and the check a process makes of itself (`missing_in_self`);
- namespaces.py: the private mount and network namespaces and the file system a process sees
  (`private_view`), the judge's working folder;
- zygote_client.py: the judge's side of the zygote that forks candidate processes;
- cgroups.py: pids cgroups and what /proc says of a process;
- seccomp.py: the system-call filter;
- landlock.py: the kernel's confinement of the file system;
- common.py: what they share (the C library, `SandboxError`, `is_root`, `python_argv`).
"""

from .cgroups import _netns, _proc_status, pin_threads
from .common import SandboxError, is_root, python_argv
from .landlock import install_landlock, landlock_abi, landlock_confined, landlock_plan, landlock_use
from .namespaces import _barrier, namespaces_problem, private_view, runtime_paths, work_root_dir
from .process import (ENV_KEEP, Sandboxed, SandboxSpec, _remove, enter_sandbox, missing_in_self, new_workdir,
                      sandbox_env)
from .seccomp import install_seccomp, seccomp_mode, seccomp_problem
from .zygote_client import Zygote

__all__ = ["ENV_KEEP", "SandboxError", "SandboxSpec", "Sandboxed", "Zygote", "enter_sandbox", "install_landlock",
           "install_seccomp", "is_root", "landlock_abi", "landlock_confined", "landlock_plan", "landlock_use",
           "missing_in_self", "namespaces_problem", "new_workdir", "pin_threads", "private_view", "python_argv",
           "runtime_paths", "sandbox_env", "seccomp_mode", "seccomp_problem", "work_root_dir",
           "_barrier", "_netns", "_proc_status", "_remove"]
