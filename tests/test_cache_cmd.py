"""`cuda-agent cache`: every part listed with its size and path, `--clear` removes exactly the
parts named, `all` leaves the results database, and headers an earlier version left in the
working folder are listed and cleared as `old-pch`."""

from __future__ import annotations

from typer.testing import CliRunner

from cuda_agent.cli import app


def _fill(path, nbytes: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * nbytes)


def test_cache_lists_and_clears_each_part(tmp_path, monkeypatch):
    cache, work = tmp_path / "cache", tmp_path / "work"
    monkeypatch.setenv("CUDA_AGENT_CACHE", str(cache))
    monkeypatch.setenv("CUDA_AGENT_WORK", str(work))
    _fill(cache / "ext" / "a" / "lib.so", 4096)
    _fill(cache / "pch" / "k" / "binding.h.gch", 2048)
    _fill(cache / "results.sqlite", 100)
    runner = CliRunner()

    shown = runner.invoke(app, ["cache"])
    assert shown.exit_code == 0, shown.output
    lines = {ln.split()[0]: ln for ln in shown.output.splitlines() if ln.strip()}
    assert "4.0 KB" in lines["ext"] and str(cache / "ext") in lines["ext"]
    assert "2.0 KB" in lines["pch"] and str(cache / "pch") in lines["pch"]
    assert "old-pch" not in lines                      # nothing left in the working folder

    _fill(work / "pch" / "old" / "binding.h.gch", 1024)
    assert "old-pch" in runner.invoke(app, ["cache"]).output

    cleared = runner.invoke(app, ["cache", "--clear", "pch"])
    assert cleared.exit_code == 0 and "cleared pch" in cleared.output
    assert not (cache / "pch").exists() and (cache / "ext").exists() and (work / "pch").exists()

    everything = runner.invoke(app, ["cache", "--clear", "all"])
    assert everything.exit_code == 0, everything.output
    assert not (cache / "ext").exists() and not (work / "pch").exists()
    assert (cache / "results.sqlite").exists()         # the record of past runs stays

    bad = runner.invoke(app, ["cache", "--clear", "nonsense"])
    assert bad.exit_code == 2 and "no such part" in bad.output
