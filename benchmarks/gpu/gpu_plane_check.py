"""Does GPU memory sharing (CUDA IPC) work on this machine, and under the sandbox's restrictions?

The judge passes per-call tensors to the candidate process through GPU memory it shares with it
(see cuda_agent/judge/cudaipc.py); where that fails it falls back to host memory and says so in the
verdict's notes. This script checks the pieces one by one and prints one line each:

1. a child process maps the judge's buffer, reads what the parent wrote and writes back, as the
   same user, in its own network namespace, and under another uid (the last two when root);
2. one judge step of a small torch (lenient policy) candidate: its notes say whether the shared
   path was used, and its phases where the time went.

    python benchmarks/gpu/gpu_plane_check.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

CHILD = r"""
import sys, torch
from cuda_agent.judge.cudaipc import SharedGpuBuffer
torch.cuda.init()
buf = SharedGpuBuffer.open(sys.argv[1], int(sys.argv[2]))
total = int(buf.tensor.sum().item())
buf.tensor.fill_(9)
torch.cuda.synchronize()
print(total)
"""


def child_variant(name: str, handle: str, nbytes: int) -> str:
    pre = None
    argv = [sys.executable, "-c", CHILD, handle, str(nbytes)]
    if name == "netns":
        argv = ["unshare", "-n", *argv]
    elif name == "uid":
        def pre():  # noqa: E306
            os.setgid(61999)
            os.setuid(61999)
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, preexec_fn=pre, timeout=120,
                         env={**os.environ, "HOME": "/tmp"})
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        return f"FAILED ({dt:.1f} s): {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}"
    return f"read {res.stdout.strip()} ({dt:.1f} s)"


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    from cuda_agent.judge.cudaipc import SharedGpuBuffer

    nbytes = 1 << 20
    buf = SharedGpuBuffer.create(nbytes)
    variants = ["same-user"] + (["netns", "uid"] if os.geteuid() == 0 else [])
    for name in variants:
        buf.tensor.fill_(7)
        torch.cuda.synchronize()
        line = child_variant(name, buf.handle.hex(), nbytes)
        back = int(buf.tensor[:4].sum().item())
        print(f"ipc {name:10s}: {line}; parent then reads {back} (expect {7 * nbytes} and 36)", flush=True)
    buf.close()

    from cuda_agent.candidate import Candidate
    from cuda_agent.judge import Judge, JudgeConfig
    from cuda_agent.tasks import Task

    task = Task.from_source(
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return torch.softmax(x, dim=-1)\n\ndef get_inputs():\n    return [torch.randn(4096, 4096)]\n\n"
        "def get_init_inputs():\n    return []\n", name="probe_softmax")
    cand = Candidate.from_source(
        "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
        "        return torch.softmax(x, dim=-1)\n")
    cfg = JudgeConfig(device="cuda", policy="lenient", compile_mode="none", cache_baselines=False)
    with Judge(cfg) as judge:
        for i in range(2):
            t0 = time.perf_counter()
            v = judge.evaluate(task, cand)
            s = v.summary()
            print(f"judge step {i}: {time.perf_counter() - t0:.2f} s correct={s['correct']} "
                  f"runtime={s['runtime_ms']} eager={s['eager_ms']} phases={json.dumps(s['phase_s'])} "
                  f"failure={s['failure']} notes={s['notes']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
