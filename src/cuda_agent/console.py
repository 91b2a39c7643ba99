"""The CLI's consoles: one place that decides how messages reach a terminal or a log.

On a terminal, rich wraps long lines to its width; in a log or a pipe (CI, `> run.log`) a message
stays one line (`soft_wrap`), so it is never cut mid-sentence at 80 columns. Error messages quote
paths, code and package extras (`cuda-agent[train]`): they are printed as text, never as markup.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, soft_wrap=not stream.isatty())


def print_error(console: Console, message: str) -> None:
    """`error: MESSAGE` on `console`, the message verbatim (square brackets included)."""
    console.print(f"[red]error:[/red] {escape(message)}")
