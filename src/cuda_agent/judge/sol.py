"""The judge's side of speed-of-light: count a task's work in the judge's own process (where the
reference already runs) and bound it on the judging GPU. Kept with the eager baseline."""

from __future__ import annotations

from cuda_agent.hardware.peaks import peaks_for
from cuda_agent.hardware.sol import SpeedOfLight, TaskWork, count_work, required_bytes, speed_of_light
from cuda_agent.tasks import Task


def task_speed_of_light(task: Task, device: str, device_name: str) -> SpeedOfLight:
    """Never raises for the task's sake: a reference whose work cannot be counted gets a record with
    no bound and the reason, so a verdict is never lost to this."""
    name = task.origin or task.name
    try:
        work = count_work(task.source, device=device, name=name)
    except ValueError as exc:
        return SpeedOfLight(work=TaskWork(counted_on="none"), device_name=device_name, reason=str(exc)[:500],
                            floor_bytes=None)
    l2_bytes = None
    if peaks_for(device_name) is not None:  # a GPU with a bound: its physical floor needs the dependence
        needed = required_bytes(task.source, device=device, name=name)
        if needed is not None:
            work = work.model_copy(update={"required_input_bytes": needed[0], "required_output_bytes": needed[1]})
        if device == "cuda":
            import torch

            l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return speed_of_light(work, device_name, l2_bytes=l2_bytes)
