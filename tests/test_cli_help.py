"""Every command's --help shows its text whole: square brackets ([judge] tables, cuda-agent[train]
extras) are words, not markup that rich would swallow."""

from __future__ import annotations

import re

import typer.main
from typer.testing import CliRunner

from cuda_agent.cli import app

BRACKETED = re.compile(r"\[[A-Za-z_][A-Za-z_.]*\]")


def _commands(cmd, path: tuple[str, ...] = ()):
    yield path, cmd
    if hasattr(cmd, "commands"):   # a group (typer may carry its own click)
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))


def _texts(cmd) -> list[str]:
    texts = [cmd.help or ""]
    texts += [getattr(p, "help", None) or "" for p in cmd.params]
    return texts


def test_help_of_every_command_keeps_its_square_brackets():
    root = typer.main.get_command(app)
    runner = CliRunner()
    checked = 0
    for path, cmd in _commands(root):
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400", "TERM": "dumb"})
        assert result.exit_code == 0, (path, result.output)
        shown = " ".join(result.output.split())
        for text in _texts(cmd):
            for word in BRACKETED.findall(text):
                checked += 1
                assert word in shown, f"`cuda-agent {' '.join(path)} --help` lost {word}"
    assert checked >= 3   # the settings tables and extras named in help texts


def test_an_error_keeps_its_square_brackets():
    from io import StringIO

    from rich.console import Console

    from cuda_agent.console import print_error

    buf = StringIO()
    print_error(Console(file=buf, soft_wrap=True), "pip install 'cuda-agent[train]'")
    assert "cuda-agent[train]" in buf.getvalue()
