"""What travels between `cuda-agent serve` and its clients: typed records, each field validated.

Candidates are untrusted: every string has a length cap, a kernel path is a plain relative path
with a source suffix, names match a short pattern, and unknown fields are refused. A task's
reference is checked statically (parsed, never imported) before it is accepted. Nothing here runs
any of the code it carries.
"""

from __future__ import annotations

import hashlib
import re
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cuda_agent.candidate import KERNEL_SUFFIXES, MAX_SOURCE_BYTES, Candidate
from cuda_agent.judge.verdict import Verdict
from cuda_agent.tasks import Task

API = "/v1"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$"     # task names, runs, groups
ID_PATTERN = r"^[0-9a-f]{32}$"
MAX_KERNEL_FILES = 64
MAX_IDS = 256                                               # submissions one status request may ask about
MAX_WAIT_S = 60.0                                           # longest a status request may wait
_KERNEL_PATH = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(/[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}){0,3}$")


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskSpec(_Wire):
    """A KernelBench-format reference module and its name."""

    name: str = Field(pattern=NAME_PATTERN)
    source: str = Field(min_length=1, max_length=MAX_SOURCE_BYTES)
    group: str = Field("", max_length=64, pattern=r"^[A-Za-z0-9_.-]*$")
    level: int | None = Field(None, ge=0, le=99)

    def to_task(self) -> Task:
        """The task record; raises TaskError when the source is not a KernelBench module (checked
        statically: parsed, never run)."""
        return Task.from_source(self.source, name=self.name, group=self.group, level=self.level,
                                origin=f"serve:{self.name}")

    @classmethod
    def of(cls, task: Task) -> "TaskSpec":
        return cls(name=task.name, source=task.source, group=task.group, level=task.level)


class KernelFile(_Wire):
    path: str = Field(max_length=520, description="relative to kernels/, e.g. softmax.cpp")
    source: str = Field(max_length=MAX_SOURCE_BYTES)

    @field_validator("path")
    @classmethod
    def _plain_relative_path(cls, path: str) -> str:
        if not _KERNEL_PATH.match(path) or ".." in path.split("/"):
            raise ValueError("a kernel path is a relative path of letters, digits, '_', '-' and '.' "
                             "(at most 4 levels, no '..')")
        if not path.endswith(KERNEL_SUFFIXES):
            raise ValueError(f"a kernel file ends with one of {', '.join(KERNEL_SUFFIXES)}")
        return path


class CandidateSpec(_Wire):
    """A candidate in either form: a single `ModelNew` file, or a workspace's `model_new.py` and kernels."""

    kind: Literal["file", "workspace"]
    model_new: str = Field(min_length=1, max_length=MAX_SOURCE_BYTES)
    kernels: list[KernelFile] = Field(default_factory=list, max_length=MAX_KERNEL_FILES)
    origin: str = Field("", max_length=500)

    @model_validator(mode="after")
    def _consistent(self) -> "CandidateSpec":
        if self.kind == "file" and self.kernels:
            raise ValueError("a single-file candidate has no kernel files (use kind 'workspace')")
        paths = [k.path for k in self.kernels]
        if len(set(paths)) != len(paths):
            raise ValueError("kernel paths repeat")
        return self

    def to_candidate(self) -> Candidate:
        return Candidate(kind=self.kind, model_new=self.model_new,
                         kernels=tuple(sorted((k.path, k.source) for k in self.kernels)), origin=self.origin)

    @classmethod
    def of(cls, candidate: Candidate) -> "CandidateSpec":
        return cls(kind=candidate.kind, model_new=candidate.model_new, origin=candidate.origin[:500],
                   kernels=[KernelFile(path=p, source=s) for p, s in candidate.kernels])


class SubmitRequest(_Wire):
    task: TaskSpec
    candidate: CandidateSpec
    run: str = Field("serve", pattern=NAME_PATTERN, description="the results database run its verdict joins")


def submission_id(run: str, task: Task, candidate: Candidate, settings: str) -> str:
    """The identity of a submission: its content (the run, the task's source and name, the
    candidate's bytes) and the service's judge settings. The same request twice is one submission."""
    text = "\0".join((run, task.id, task.name, candidate.hash, settings))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class State(str, Enum):
    QUEUED = "queued"        # accepted and stored, waiting for the pool
    JUDGING = "judging"      # handed to the pool
    DONE = "done"            # its verdict is committed to the results database
    FAILED = "failed"        # the judge could not judge it (a broken task); resubmitting tries again


class JudgeFailureInfo(_Wire):
    category: str            # baseline, reference or judge (see cuda_agent.db.StoredFailure)
    message: str


class Submission(BaseModel):
    """A submission as the service knows it; `verdict` once `done`, `failure` once `failed`."""

    id: str
    run: str
    state: State
    task_id: str
    task_name: str
    candidate_hash: str
    submitted_at: float
    finished_at: float | None = None
    verdict: Verdict | None = None
    failure: JudgeFailureInfo | None = None

    @property
    def finished(self) -> bool:
        return self.state in (State.DONE, State.FAILED)


class StatusRequest(_Wire):
    ids: list[str] = Field(min_length=1, max_length=MAX_IDS)
    wait_s: float = Field(0.0, ge=0.0, le=MAX_WAIT_S,
                          description="wait up to this long until one of them is finished")

    @field_validator("ids")
    @classmethod
    def _ids(cls, ids: list[str]) -> list[str]:
        for i in ids:
            if not re.match(ID_PATTERN, i):
                raise ValueError("a submission id is 32 lowercase hex digits")
        return ids


class StatusReply(BaseModel):
    submissions: list[Submission]
    unknown: list[str] = Field(default_factory=list)


class Health(BaseModel):
    status: Literal["ok", "starting", "broken"]
    judge_workers: int
    compile_workers: int
    queued: int              # accepted, not yet finished
    detail: str = ""


class ServiceInfo(BaseModel):
    """What the service judges with (clients record it with their results)."""

    device: str
    settings_digest: str
    judge_config: dict
    device_names: list[str]
    max_request_bytes: int
    max_pending: int
