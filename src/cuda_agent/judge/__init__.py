"""The judge: compile -> verify -> profile -> Verdict. See harness.py for the data flow."""

from .config import JudgeConfig
from .harness import Judge, JudgeError, judge
from .verdict import CallRecord, Failure, FailureCategory, Timing, Verdict

__all__ = ["Judge", "JudgeConfig", "JudgeError", "judge", "Verdict", "Failure", "FailureCategory", "Timing",
           "CallRecord"]
