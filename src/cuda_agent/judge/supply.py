"""The supply of judge worker processes: spares started ahead of need, the zygote, uid rotation.

A worker is a sandboxed process that will run one candidate (or one trusted reference or
baseline) under the call protocol (worker.py). Starting one costs seconds on CUDA (interpreter,
torch, GPU context, profiler), so `WorkerSupply` keeps `JudgeConfig.spares` of them started with no
task yet and hands out the oldest; on the CPU backend workers are forked from a zygote that has
imported torch once. Each worker alive at once has a uid no other has (when the judge is root):
cleaning up after one (which kills every process of its uid) never touches another.

`ZygoteHolder` is the one rule for when a zygote is used and how it is (re)started, shared by the
judge, its builder and the pool's compile workers.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from pathlib import Path

from cuda_agent import host

from . import launches
from .config import JudgeConfig
from .protocol import DataPlane, send_plane
from .sandbox import SandboxSpec, Sandboxed, Zygote, new_workdir, pin_threads, python_argv

# A worker started ahead of need and the judge's end of its socket.
Worker = tuple[Sandboxed, socket.socket]


class ZygoteHolder:
    """The zygote of one process (judge, builder or compile worker), started on first use and
    again when it died. By default only on the CPU backend: a CUDA context cannot survive a fork,
    so on CUDA the spares start fresh interpreters instead."""

    def __init__(self, config: JudgeConfig, builds: bool = False):
        """`builds`: the zygote of build jobs (JudgeConfig.build_zygote; on by default on both backends)."""
        self.device = config.device
        if builds:
            # build jobs never initialise CUDA: forked on either backend unless zygotes are switched off
            choice = config.build_zygote if config.build_zygote is not None else config.use_zygote is not False
        else:
            choice = config.use_zygote if config.use_zygote is not None else config.device == "cpu"
        self.wanted = choice
        self._zygote: Zygote | None = None

    def __call__(self) -> Zygote | None:
        if not self.wanted:
            return None
        if self._zygote is None or self._zygote.proc.poll() is not None:
            # idle OpenMP threads must sleep, not spin: spinning would be charged to the next call
            self._zygote = Zygote(env={"OMP_WAIT_POLICY": "PASSIVE"} if self.device == "cpu" else {})
        return self._zygote

    @property
    def pid(self) -> int | None:
        """The zygote's process id while one has been started (alive or not)."""
        return self._zygote.proc.pid if self._zygote is not None else None

    def close(self) -> None:
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None


class WorkerSupply:
    """Worker processes for one judge: `take(plane)` returns one that has the data plane and no
    task yet, and starts its replacement. Not thread-safe (the judge is not)."""

    def __init__(self, config: JudgeConfig, uid: int | None, work_root: Path):
        """`uid`: the judge's own sandbox uid (None when it cannot drop privileges); spares rotate
        through `host.spare_uid(uid, k)` for k < spares + 1."""
        self.config = config
        self.device = config.device
        self.uid = uid
        self.work_root = work_root
        self.zygote = ZygoteHolder(config)
        self.spares: list[Worker] = []  # started ahead of need, oldest first
        self._launches = 0
        # the judge's launch observer library (CandidateBuilds.launches_library), set by the judge
        self.launches_library: Callable[[], Path | None] | None = None

    def take(self, plane: DataPlane, live: list[Sandboxed]) -> Worker:
        """A worker for one evaluation's process, the data plane already handed to it, pinned to
        the timing cores and added to `live` (the evaluation's processes, stopped at its end) before
        the spares are refilled."""
        zygote = self.zygote()
        if zygote is not None:
            proc, sock = self._launch(zygote, plane)
            live.append(proc)
            return proc, sock
        # The oldest spare (torch imported, GPU context made, or nearly so) takes the task;
        # replacements start now, each under a uid no other live worker has, so that cleaning
        # up after this one cannot touch them.
        spare = None
        while self.spares and spare is None:
            spare = self.spares.pop(0)
            if not spare[0].alive():
                self.drop(spare)
                spare = None
        proc, sock = spare if spare is not None else self._launch()
        try:
            send_plane(sock, plane.fd, plane.size, plane.in_size)
        except OSError:  # the spare died after all: start one for this task
            self.drop((proc, sock))
            proc, sock = self._launch()
            send_plane(sock, plane.fd, plane.size, plane.in_size)
        live.append(proc)
        pin_threads(proc.pid, self.config.timing_cpus)
        while len(self.spares) < self.config.spares:
            spare = self._launch()
            pin_threads(spare[0].pid, self.config.spare_cpus)  # its start-up stays off the timed cores
            self.spares.append(spare)
        return proc, sock

    def _launch(self, zygote: Zygote | None = None, plane: DataPlane | None = None) -> Worker:
        """A worker process with nothing of a task yet. Forked from the zygote, it gets the data
        plane at once; started as a fresh interpreter, it waits for it (see `send_plane`)."""
        workdir = new_workdir(self.work_root / "runs", "cand-")
        parent_sock, child_sock = socket.socketpair()
        if self.device == "cpu":
            # idle OpenMP threads must sleep, not spin: spinning would be charged to the next call
            env = {"CUDA_VISIBLE_DEVICES": "", "OMP_WAIT_POLICY": "PASSIVE"}
        else:
            env = {"CUDA_AGENT_PREINIT": "cuda"}
            if self.place_launches(workdir):  # subscribed while the spare waits for a task
                env["CUDA_AGENT_LAUNCHES"] = str(workdir / launches.FILE)
        plane_args = (plane.fd, plane.size, plane.in_size) if plane is not None else (-1, 0, 0)
        uid = self.uid
        if self.uid is not None and zygote is None:
            # Live worker and spares never share a uid: at most 1 + spares are alive at once.
            self._launches += 1
            uid = host.spare_uid(self.uid, self._launches % (self.config.spares + 1))
        spec = SandboxSpec(
            argv=python_argv("cuda_agent.judge.worker", str(child_sock.fileno()), *map(str, plane_args)),
            workdir=workdir, uid=uid, pass_fds=(child_sock.fileno(),) + ((plane.fd,) if plane else ()), env=env,
            address_space_mb=(self.config.memory_limit_mb + 8192) if self.device == "cpu" else None,
            target="worker", target_args=list(plane_args[1:]), hide=(self.config.cache_dir, self.work_root),
            landlock=self.config.landlock_mode())
        try:
            proc = Sandboxed(spec, zygote)
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        return proc, parent_sock

    def place_launches(self, workdir: Path) -> bool:
        """The judge's launch observer (launches.py) in a CUDA worker's folder, where it can be
        built. Placed once: a spare may have it loaded already, and a loaded library is never
        rewritten. Owned by the judge, like the operator observer."""
        if self.device != "cuda" or self.launches_library is None:
            return False
        dest = workdir / launches.FILE
        if not dest.exists():
            library = self.launches_library()
            if library is None:
                return False
            shutil.copy2(library, dest)
        return True

    @staticmethod
    def drop(worker: Worker | None) -> None:
        if worker is not None:
            worker[1].close()
            worker[0].cleanup()

    def standby_pids(self) -> set[int]:
        """Processes kept between evaluations on purpose: the spares (which run no candidate code
        until a task is sent to them) and the zygote."""
        pids = {proc.pid for proc, _ in self.spares if proc.alive()}
        if self.zygote.pid is not None:
            pids.add(self.zygote.pid)
        return pids

    def sandbox_uids(self) -> set[int]:
        """Every uid this supply runs workers under (empty when it cannot drop privileges)."""
        if self.uid is None:
            return set()
        return {host.spare_uid(self.uid, i) for i in range(self.config.spares + 1)}

    def close(self) -> None:
        for spare in self.spares:
            self.drop(spare)
        self.spares = []
        self.zygote.close()
