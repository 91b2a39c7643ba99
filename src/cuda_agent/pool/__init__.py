"""Judge candidates by the thousand: a pool of judge workers (one per GPU) and compile workers.

    from cuda_agent.pool import Pool, PoolConfig

    with Pool(JudgeConfig(device="cuda"), PoolConfig(baseline_db=Path("results.sqlite"))) as pool:
        futures = [pool.submit(task, candidate) for task, candidate in work]
        verdicts = [f.result() for f in futures]

See pool.py for scheduling, limits and failure handling, transport.py for the worker interface.
"""

from .pool import Pool, PoolConfig, PoolError, PoolFull, PoolStats, visible_gpus
from .transport import LocalTransport, Transport, WorkerHandle, WorkerSpec

__all__ = ["Pool", "PoolConfig", "PoolError", "PoolFull", "PoolStats", "visible_gpus", "LocalTransport",
           "Transport", "WorkerHandle", "WorkerSpec"]
