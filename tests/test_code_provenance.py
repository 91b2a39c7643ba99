"""Candidate code where the judge does not look: code compiled from anything the judge did not read
(the audit hook's rule, guards._code_source_refusal; each case runs in a fresh interpreter, since
an audit hook cannot be removed from a process), and candidate code left to run inside the
harness's own work (worker._escapes)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PRELUDE = textwrap.dedent("""
    import os, sys, tempfile
    workdir = tempfile.mkdtemp()
    os.chdir(workdir)
    from cuda_agent.judge import guards
    blocked = []
    guards._install_audit_hook(workdir, blocked)

    def refused(fn):
        try:
            fn()
        except PermissionError:
            return True
        return False
""")


def run(body: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True, text=True,
                          timeout=120)


def check(body: str) -> None:
    proc = run(textwrap.dedent(body) + "\nprint('DONE')\n")
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stdout + proc.stderr


def test_strings_and_hand_built_code_are_refused():
    check("""
        assert refused(lambda: exec("x = 1"))
        assert refused(lambda: eval("1 + 1"))
        assert refused(lambda: compile("x = 1", "<string>", "exec"))
        assert refused(lambda: guards._code_source_refusal.__code__.replace(co_name="other"))
        assert any("did not check" in b for b in blocked) and any("by hand" in b for b in blocked)
    """)


def test_torch_package_importer_cannot_run_a_string():
    check("""
        import io
        import torch
        buf = io.BytesIO()
        with torch.package.PackageExporter(buf) as exporter:
            exporter.save_source_string("unchecked", "VALUE = 42\\n")
        buf.seek(0)
        importer = torch.package.PackageImporter(buf)
        assert refused(lambda: importer.import_module("unchecked"))
        assert any("torch_package" in b for b in blocked)
    """)


def test_the_candidates_source_compiles_once_and_only_as_read():
    check("""
        path = os.path.join(workdir, "model_new.py")
        source = b"VALUE = 7\\n"
        with open(path, "wb") as fh:
            fh.write(source)
        assert refused(lambda: compile(source, path, "exec"))            # not announced
        guards._EXPECTED_SOURCE[:] = [(os.path.realpath(path), b"VALUE = 8\\n")]
        assert refused(lambda: compile(source, path, "exec"))            # other bytes than announced
        guards._EXPECTED_SOURCE[:] = [(os.path.realpath(path), source)]
        namespace = {}
        exec(compile(source, path, "exec"), namespace)
        assert namespace["VALUE"] == 7
        assert refused(lambda: compile(source, path, "exec"))            # once only
    """)


def test_dataclasses_namedtuple_and_lazy_library_imports_still_work():
    check("""
        import collections, dataclasses, typing
        @dataclasses.dataclass(frozen=True)
        class Config:
            size: int
            name: str = "x"
        Pair = collections.namedtuple("Pair", ["low", "high"])
        class Span(typing.NamedTuple):
            start: int
            stop: int
        assert Config(3).size == 3 and Pair(1, 2).high == 2 and Span(0, 5).stop == 5
        import ast
        assert isinstance(ast.parse("a + b"), ast.Module)
        import json.tool, xml.dom.minidom   # installed modules, from their bytecode caches or source
        import mpmath                       # generates functions with exec as it loads (torch needs sympy)
        assert mpmath.mpf(2) + 1 == 3
        assert not blocked, blocked
    """)


def test_a_library_that_compiles_a_string_for_the_candidate_after_its_import_is_refused():
    check("""
        import mpmath
        import timeit                       # compiles the statement it is given, a string
        assert refused(lambda: timeit.Timer("x = 1"))
    """)


def test_a_field_name_carrying_code_into_a_generated_method_is_refused():
    check("""
        import dataclasses
        def make():
            ns = {"__annotations__": {"x=0\\n  __import__('os').getpid()\\n  self.y": int}}
            return dataclasses.dataclass(type("Hidden", (), ns))
        assert refused(make)
        assert any("generated code" in b for b in blocked)
    """)


def test_a_loader_that_passes_off_other_bytes_as_an_installed_file_is_refused():
    check("""
        import importlib.machinery, importlib.util, json
        installed = json.__file__

        class Forged(importlib.machinery.SourceFileLoader):
            def get_data(self, path):
                if path.endswith(".py"):
                    return b"FORGED = True\\n"
                raise OSError("no cache")

        spec = importlib.util.spec_from_file_location("forged", installed, loader=Forged("forged", installed))
        module = importlib.util.module_from_spec(spec)
        assert refused(lambda: spec.loader.exec_module(module))
        assert not hasattr(module, "FORGED")
    """)


def test_modes_left_active_and_outputs_that_run_code_are_escapes():
    import torch

    from cuda_agent.judge.worker import _escapes

    assert _escapes(torch) == []
    assert _escapes(torch, (torch.ones(2), [1, 2.0, None, "x"], {"k": torch.nn.Parameter(torch.ones(1))})) == []

    class Sub(torch.Tensor):
        pass

    class Box(list):
        pass

    tagged = torch.ones(2)
    tagged.note = "hidden state"
    for out, word in ((torch.ones(2).as_subclass(Sub), "Sub"), ([Box()], "Box"), ((tagged,), "attributes")):
        found = _escapes(torch, out)
        assert len(found) == 1 and word in found[0], found
    with torch.overrides.TorchFunctionMode():
        assert any("torch function mode" in f for f in _escapes(torch))
    assert _escapes(torch) == []
    carrier = torch.ones(2)
    assert _escapes(torch, torch.ones(1), [torch.ones(2), carrier]) == []
    carrier.keeper = object()
    assert any("input tensor" in f for f in _escapes(torch, torch.ones(1), [torch.ones(2), carrier]))
