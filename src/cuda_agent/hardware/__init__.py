"""What the hardware can do: peak figures per GPU model, the speed-of-light of a task (the least
work its reference implies, and the least time that work can take on a GPU), and Nsight Compute's
per-kernel counters summarised for the agent."""

from .peaks import GPU_PEAKS, GpuPeaks, peaks_for
from .sol import SpeedOfLight, TaskWork, count_work, speed_of_light

__all__ = ["GPU_PEAKS", "GpuPeaks", "peaks_for", "SpeedOfLight", "TaskWork", "count_work", "speed_of_light"]
