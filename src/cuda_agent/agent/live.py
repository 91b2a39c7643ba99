"""What `cuda-agent solve` shows while a run goes: the loop's progress reports, drawn with rich.

On a terminal a live panel is redrawn in place: the turn, the elapsed time, the tokens used and the
context filled, the best candidate so far and the last tool calls with their results. Where stderr
is not a terminal (a log file, CI) redrawing makes no sense, so one plain line is written per tool
call and per reply that called none: the log keeps the run's history.

The loop knows nothing of this module: it calls `LiveView.update` through `Agent(on_progress=...)`.
"""

from __future__ import annotations

from collections import deque

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cuda_agent.judge import Verdict
from cuda_agent.report import fmt_x

from .loop import AgentProgress

RECENT = 8  # tool calls kept in the live panel


def tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def _reward(r) -> str:
    return "-" if r is None else f"{r.value:g}"


def verdict_words(v: Verdict, reward=None) -> str:
    """A verdict in a few words, as rich markup (the failure's category, never its long message);
    `reward`: the verdict as the environment scored it."""
    if v.correct:
        return (f"[green]correct[/green], reward {_reward(reward)}, {fmt_x(v.speedup_vs_eager)} vs eager, "
                f"{fmt_x(v.speedup_vs_compile)} vs torch.compile")
    if v.failure is not None:
        first = v.failure.message.strip().splitlines()[0] if v.failure.message.strip() else ""
        first = first if len(first) <= 80 else first[:77] + "..."
        return f"[red]{v.failure.category.value}[/red]" + (f": {escape(first)}" if first else "")
    return "[red]rejected[/red]" if v.compiled else "[red]not compiled[/red]"


def best_words(p: AgentProgress) -> str:
    if p.best is None:
        return "no correct candidate yet"
    return (f"reward {_reward(p.best_reward)}, {fmt_x(p.best.speedup_vs_eager)} vs eager, "
            f"{fmt_x(p.best.speedup_vs_compile)} vs torch.compile (turn {p.best_turn})")


def status_words(p: AgentProgress) -> str:
    return (f"turn {p.turn}/{p.max_turns}, {clock(p.seconds)}, tokens {tokens(p.prompt_tokens)} in + "
            f"{tokens(p.completion_tokens)} out, context {tokens(p.context_tokens)}/{tokens(p.context_budget)}")


def step_words(p: AgentProgress) -> str | None:
    """The result of one event as markup, or None for an event with nothing to show by itself."""
    if p.event == "tool":
        if p.verdict is not None:
            return verdict_words(p.verdict, p.reward)
        return "ok" if p.ok else "[yellow]failed[/yellow]"
    if p.tool_calls == 0:
        return "[yellow]the reply called no tool[/yellow]"
    return None


def log_line(p: AgentProgress) -> str | None:
    """One plain line per event worth a line (markup, to be printed by rich)."""
    what = step_words(p)
    if what is None:
        return None
    tool = escape(p.tool) if p.tool else "model"
    best = "no correct candidate yet"
    if p.best is not None:  # vs torch.compile, the goal; vs eager where no compiled baseline was timed
        best = (f"best {fmt_x(p.best.speedup_vs_compile)} vs torch.compile" if p.best.speedup_vs_compile
                else f"best {fmt_x(p.best.speedup_vs_eager)} vs eager")
    return f"turn {p.turn}/{p.max_turns} {tool}: {what} | {best} | tokens {tokens(p.prompt_tokens + p.completion_tokens)}"


class LiveView:
    """Draws a run's progress on `console` (stderr by default). Use as a context manager."""

    def __init__(self, console: Console | None = None, *, live: bool | None = None):
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal if live is None else live
        self.recent: deque[tuple[int, str, str]] = deque(maxlen=RECENT)
        self.last: AgentProgress | None = None
        self._live: Live | None = None

    def __enter__(self) -> "LiveView":
        if self.live:
            self._live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.update(self.render(), refresh=True)
            self._live.__exit__(*exc)
            self._live = None

    def update(self, p: AgentProgress) -> None:
        self.last = p
        what = step_words(p)
        if what is not None:
            self.recent.append((p.turn, escape(p.tool) if p.tool else "(model)", what))
        if self._live is not None:
            self._live.update(self.render())
        elif (line := log_line(p)) is not None:
            self.console.print(line, highlight=False, soft_wrap=True)

    def render(self) -> Group:
        p = self.last
        if p is None:
            return Group(Text("waiting for the model's first reply..."))
        head = Text.from_markup(f"[bold]{escape(p.task_name)}[/bold]  {status_words(p)}")
        best = Text.from_markup(f"best: {best_words(p)}")
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False, expand=False)
        table.add_column("turn", justify="right")
        table.add_column("tool")
        table.add_column("result", overflow="ellipsis", no_wrap=True)
        for turn, tool, what in self.recent:
            table.add_row(str(turn), tool, Text.from_markup(what))
        return Group(head, best, table)
