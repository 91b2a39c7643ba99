"""Stand-ins for the training tests: a judge gate with scripted verdicts and a policy that replays
scripted replies as tokens."""

from __future__ import annotations

import threading

from cuda_agent.judge.verdict import Failure, FailureCategory, Timing, Verdict
from cuda_agent.train.episode import Generation


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, mean_ms=ms, min_ms=ms, max_ms=ms, p10_ms=ms, p90_ms=ms, std_ms=0.0, n=5)


def verdict(task, cand, *, correct: bool, category: FailureCategory = FailureCategory.MISMATCH,
            runtime_ms: float = 1.0) -> Verdict:
    if correct:
        return Verdict(task_id=task.id, task_name=task.name, candidate_hash=cand.hash, device="cpu", compiled=True,
                       correct=True, runtime=_timing(runtime_ms), eager=_timing(2.0))
    return Verdict(task_id=task.id, task_name=task.name, candidate_hash=cand.hash, device="cpu",
                   compiled=category is not FailureCategory.COMPILE,
                   failure=Failure(category=category, message=f"scripted {category.value}"))


class FakeGate:
    """A scripted `Evaluator` (rollout/evaluator.py): a candidate whose model_new (or single file) contains GOOD is correct (2x faster
    than eager), one containing HACK is a tampering failure, anything else a mismatch."""

    device = "cpu"
    local = True

    def __init__(self):
        self.judged = 0
        self._lock = threading.Lock()

    def evaluate(self, task, cand):
        with self._lock:
            self.judged += 1
        text = cand.model_new
        if "GOOD" in text:
            return verdict(task, cand, correct=True)
        if "HACK" in text:
            return verdict(task, cand, correct=False, category=FailureCategory.TAMPERING)
        return verdict(task, cand, correct=False)

    def build(self, cand, task=None):
        raise AssertionError("the tests' scripts do not compile")

    def exclusive(self):
        return self._lock

    def close(self):
        pass


class ScriptedPolicy:
    """Replays scripted reply texts as token ids (EOS appended unless the text ends with the
    marker CUT, which makes the turn end at the token limit). Records every prompt it was given, the
    session of every call and the sessions ended."""

    def __init__(self, renderer, replies: list[str]):
        self.renderer = renderer
        self.replies = list(replies)
        self.prompts: list[list[int]] = []
        self.generations: list[Generation] = []
        self.sessions: list[str | None] = []
        self.ended: list[str] = []

    def generate(self, prompt_ids, max_new_tokens, temperature, session=None):
        self.prompts.append(list(prompt_ids))
        self.sessions.append(session)
        text = self.replies.pop(0) if self.replies else "nothing more"
        cut = text.endswith("CUT")
        ids = self.renderer.encode(text.removesuffix("CUT"))
        if not cut:
            ids = ids + [self.renderer.eos_id]
        ids = ids[:max_new_tokens]
        finish = "length" if cut or len(ids) == max_new_tokens and ids[-1] != self.renderer.eos_id else "stop"
        gen = Generation(token_ids=ids, logprobs=[-0.5 - 0.001 * i for i in range(len(ids))], finish=finish)
        self.generations.append(gen)
        return gen

    def end_session(self, session):
        self.ended.append(session)
