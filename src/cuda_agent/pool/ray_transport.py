"""Judge and compile workers as Ray actors: one judge per GPU on every node of a Ray cluster, compile
workers on CPU cores anywhere, behind the same `Transport` interface as local processes.

    import ray
    from cuda_agent.pool import Pool, PoolConfig
    from cuda_agent.pool.ray_transport import RayTransport

    ray.init(address="auto")                      # or RayTransport(address="auto") starts/joins it
    with Pool(JudgeConfig(device="cuda"), PoolConfig(baseline_db=Path("results.sqlite")),
              transport=RayTransport()) as pool:
        future = pool.submit(task, candidate)     # concurrent.futures.Future[Verdict], as before

The pool's scheduler (pool.py) is unchanged: time limits, replacement of wedged or dead workers,
the single retry and the crash verdict, and a task's first candidate running alone on each GPU
model all work through `start`/`send`/`poll`/`kill` here exactly as with local processes.

What Ray changes:
* **Placement.** Judge workers are counted from the cluster's GPUs (`ray.cluster_resources()`);
  each judge actor asks Ray for one GPU (Ray sets its `CUDA_VISIBLE_DEVICES`) and two CPUs, which
  it pins its timed calls to on its own node, as the local pool does (the rest of the node's cores
  go to its spare processes); on the CPU backend a judge asks for one CPU. Compile actors ask for
  one CPU each and, on a node with GPUs, keep off the judges' cores at a lower priority.
* **Baselines.** A results database (`PoolConfig.baseline_db`) lives on the driver's machine: an
  actor pinned to the driver's node holds it, and every judge actor reads and writes baselines
  through it, so each task's baselines are measured once per GPU model across the whole cluster.
* **Deaths.** An actor that dies (its process killed, its node lost) surfaces as a
  `RayActorError` on its pending call or on a liveness ping, which the handle reports as a dead
  worker; the pool replaces it. Actors are owned by the driver: they die with it.

Not covered: compile workers build into the judge's cache folder (`JudgeConfig.cache_dir`) on
their own node, so a build done ahead helps a judge on another node only when that folder is on
a filesystem the nodes share; otherwise the judge builds (correct, just slower). Every node needs
this package (and its toolchain) installed at the same version as the driver.
"""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic import BaseModel

from cuda_agent import host
from cuda_agent.judge.config import JudgeConfig

from .transport import Placement, PlacementError, Stop, WorkerGone, WorkerSpec

JUDGE_CPUS_CUDA = 2      # cores a CUDA judge holds: its own and the timed candidate's (as the local pool)
PING_INTERVAL_S = 1.0    # how often an idle actor is asked whether it still lives


def _ray():
    try:
        import ray
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise ImportError("the Ray transport needs Ray: pip install 'cuda-agent[ray]'") from None
    return ray


class _WorkerActor:
    """The body of a worker actor: the same servers a local worker process runs."""

    def __init__(self, spec: WorkerSpec, baseline_store: Any = None):
        self.spec = spec
        self.baseline_store = baseline_store
        self.server = None

    def hello(self) -> BaseModel:
        from .transport import StartupFailed
        from .workers import make_server, prepare_process

        spec = self.spec
        try:
            spec = spec.model_copy(update=_node_local_cores(spec))
        except Exception as exc:  # noqa: BLE001 - said to the pool as a failed start
            return StartupFailed(message=f"placing the worker on its node failed: {type(exc).__name__}: {exc}")
        prepare_process(spec)
        server = make_server(spec, self.baseline_store)
        if isinstance(server, StartupFailed):
            return server
        self.server = server
        return server.hello()

    def handle(self, message: BaseModel) -> BaseModel:
        return self.server.handle(message)

    def ping(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def _node_local_cores(spec: WorkerSpec) -> dict:
    """Cores on this actor's node, chosen as the local pool chooses them on its machine: two per GPU
    for the judges' timed calls (by the GPU's index on the node), the rest for spare processes and
    builds. A node with fewer than four cores per GPU pins nothing (as locally)."""
    if spec.config.device != "cuda":
        return {}
    ray = _ray()
    node_id = ray.get_runtime_context().get_node_id()
    node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), {})
    node_gpus = int(node.get("Resources", {}).get("GPU", 0))
    allowed = host.usable_cpus()
    if node_gpus == 0 or len(allowed) < 4 * node_gpus:
        return {}
    rest = allowed[2 * node_gpus:]
    if spec.role == "compile":
        return {"cpus": rest}
    ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    index = int(ids[0]) if ids else 0
    timing = allowed[2 * index:2 * index + 2]
    return {"config": spec.config.model_copy(update={"timing_cpus": timing, "spare_cpus": rest})}


class _BaselineStoreActor:
    """The results database's baselines, served from the driver's node to every judge actor."""

    def __init__(self, path: str):
        from cuda_agent.db import SqliteBaselineStore

        self.store = SqliteBaselineStore(path)

    def get(self, key):
        return self.store.get(key)

    def put(self, key, baseline) -> None:
        self.store.put(key, baseline)


class RemoteBaselineStore:
    """A `BaselineStore` whose get and put are calls to the baseline actor."""

    def __init__(self, actor):
        self.actor = actor

    def get(self, key):
        return _ray().get(self.actor.get.remote(key))

    def put(self, key, baseline) -> None:
        _ray().get(self.actor.put.remote(key, baseline))

    def close(self) -> None:
        pass


class _RayHandle:
    """One worker actor. At most one request is outstanding at a time (the pool sends the next only
    after the reply), so replies are read in order from a short list of object refs."""

    def __init__(self, spec: WorkerSpec, actor):
        self.spec = spec
        self.actor = actor
        self._pending: list = [actor.hello.remote()]
        self._closing = None
        self._ping = None
        self._ping_sent = 0.0
        self._dead: str | None = None

    def refs(self) -> list:
        out = self._pending[:1]
        for ref in (self._closing, self._ping):
            if ref is not None:
                out.append(ref)
        return out

    def send(self, message: BaseModel) -> None:
        if self._dead is not None:
            raise WorkerGone(self._dead)
        if isinstance(message, Stop):
            self._closing = self.actor.close.remote()
            return
        self._pending.append(self.actor.handle.remote(message))

    def poll(self, timeout: float = 0.0) -> BaseModel | None:
        ray = _ray()
        if self._dead is not None:
            raise WorkerGone(self._dead)
        if not self._pending:
            return None
        ready, _ = ray.wait(self._pending[:1], timeout=timeout)
        if not ready:
            return None
        ref = self._pending.pop(0)
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:
            self._gone(exc)
            raise WorkerGone(self._dead) from None

    def _gone(self, exc: BaseException) -> None:
        ray = _ray()
        if isinstance(exc, ray.exceptions.RayActorError):
            # Ray's message is many lines of possible causes; its first line says what happened.
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self._dead = f"died (Ray actor lost: {first[:300]})"
        else:  # a call failed inside the actor outside the servers' own error handling
            self._dead = f"failed: {type(exc).__name__}: {str(exc)[:300]}"

    def alive(self) -> bool:
        if self._dead is not None:
            return False
        ray = _ray()
        if self._closing is not None:
            ready, _ = ray.wait([self._closing], timeout=0)
            return not ready
        if self._pending:
            return True  # a death shows on the pending call
        if self._ping is not None:
            ready, _ = ray.wait([self._ping], timeout=0)
            if not ready:
                return True
            try:
                ray.get(self._ping)
            except ray.exceptions.RayError as exc:
                self._gone(exc)
                return False
            self._ping = None
        if time.monotonic() - self._ping_sent >= PING_INTERVAL_S:
            self._ping, self._ping_sent = self.actor.ping.remote(), time.monotonic()
        return True

    def exit_description(self) -> str:
        if self._dead is not None:
            return self._dead
        return "still running"

    def kill(self) -> None:
        try:
            _ray().kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if self._dead is None:
            self._dead = "killed by the pool"


class RayTransport:
    """Workers as Ray actors. Joins the Ray instance this process has, else calls `ray.init` with
    `address` and `init_kwargs` (and shuts it down again in `close`)."""

    def __init__(self, address: str | None = None, **init_kwargs):
        ray = _ray()
        self._owns_ray = False
        if not ray.is_initialized():
            ray.init(address=address, **init_kwargs)
            self._owns_ray = True
        self._actor_cls = ray.remote(_WorkerActor)
        self._store_actor = None
        self._store_path: str | None = None

    def placement(self, config: JudgeConfig, judge_workers: int | None, compile_workers: int | None,
                  judges_per_gpu: int = 1) -> Placement:
        """Judges from the cluster's GPUs, `judges_per_gpu` each (CPU backend: `judge_workers`,
        default 1); compile workers on the CPUs that leaves, less one for the driver."""
        from cuda_agent.judge.harness import JudgeError

        resources = _ray().cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
        if config.device == "cuda":
            if gpus == 0:
                raise JudgeError("device 'cuda' requested but the Ray cluster has no GPU (use --device cpu)")
            n_judges = judge_workers or gpus * judges_per_gpu
            if n_judges > gpus * judges_per_gpu:
                raise PlacementError(f"{n_judges} judge workers asked for, the Ray cluster has {gpus} GPUs and "
                                     f"{judges_per_gpu} judge(s) per GPU: judges that share a GPU take turns for "
                                     "their timed calls (--judges-per-gpu)")
            default_compile = max(1, cpus - JUDGE_CPUS_CUDA * n_judges - 1)
        else:
            n_judges = judge_workers or 1
            if n_judges > cpus:
                raise PlacementError(f"{n_judges} judge workers asked for, the Ray cluster has {cpus} CPUs")
            default_compile = max(0, cpus - n_judges - 1) if cpus >= 4 else 0
        n_compile = compile_workers if compile_workers is not None else default_compile
        # No local CUDA_VISIBLE_DEVICES (Ray assigns each judge actor its GPU) and no core ids: those
        # are chosen on each node by the actor itself.
        return Placement(judges=n_judges, judge_env=[{} for _ in range(n_judges)],
                         timing_cpus=[None] * n_judges, spare_cpus=None, compile_workers=n_compile, build_jobs=1)

    def _baseline_store(self, path) -> Any:
        ray = _ray()
        if self._store_actor is None or self._store_path != str(path):
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = ray.get_runtime_context().get_node_id()
            self._store_actor = ray.remote(_BaselineStoreActor).options(
                num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
            ).remote(str(path))
            self._store_path = str(path)
        return RemoteBaselineStore(self._store_actor)

    def start(self, spec: WorkerSpec) -> _RayHandle:
        store = None
        if spec.role == "judge" and spec.baseline_db is not None:
            store = self._baseline_store(spec.baseline_db)
            spec = spec.model_copy(update={"baseline_db": None})
        if spec.role == "judge" and spec.config.device == "cuda":
            # a fraction of a GPU where judges share one: Ray places them on the same GPU and sets
            # CUDA_VISIBLE_DEVICES, which names the GPU's lock (JudgeConfig.device_lock)
            resources = {"num_gpus": spec.gpu_share, "num_cpus": JUDGE_CPUS_CUDA}
        else:
            resources = {"num_gpus": 0, "num_cpus": 1}
        actor = self._actor_cls.options(name=None, max_restarts=0, max_task_retries=0, **resources).remote(spec, store)
        return _RayHandle(spec, actor)

    def wait(self, handles: list[_RayHandle], timeout: float) -> None:
        refs = [ref for h in handles for ref in h.refs()]
        if refs:
            _ray().wait(refs, num_returns=1, timeout=timeout)
        elif timeout > 0:
            time.sleep(timeout)

    def close(self) -> None:
        """Stop the baseline actor, and Ray itself when this transport started it."""
        ray = _ray()
        if self._store_actor is not None:
            try:
                ray.kill(self._store_actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
            self._store_actor = None
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
