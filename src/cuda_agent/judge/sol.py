"""The judge's side of speed-of-light: count a task's work in the judge's own process (where the
reference already runs) and bound it on the judging GPU. Kept with the eager baseline."""

from __future__ import annotations

from cuda_agent.hardware.sol import SpeedOfLight, TaskWork, count_work, speed_of_light
from cuda_agent.tasks import Task


def task_speed_of_light(task: Task, device: str, device_name: str) -> SpeedOfLight:
    """Never raises for the task's sake: a reference whose work cannot be counted gets a record with
    no bound and the reason, so a verdict is never lost to this."""
    try:
        work = count_work(task.source, device=device, name=task.origin or task.name)
    except ValueError as exc:
        return SpeedOfLight(work=TaskWork(counted_on="none"), device_name=device_name, reason=str(exc)[:500])
    return speed_of_light(work, device_name)
