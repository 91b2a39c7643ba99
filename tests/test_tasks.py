"""Task loaders: KernelBench-style folders, single files, Ops-6K JSONL and Parquet."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pydantic
import pytest

from cuda_agent.tasks import (
    Task,
    TaskError,
    iter_jsonl_tasks,
    iter_parquet_tasks,
    load_kernelbench_dir,
    load_task_file,
    load_tasks,
    validate_reference_source,
)


def ref_source(body: str = "return torch.relu(x)", shape: str = "16, 32") -> str:
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        {body}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
'''


GOOD = ref_source()


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def kb_dir(tmp_path: Path) -> Path:
    root = tmp_path / "KernelBench"
    write(root / "level1" / "10_ReLU.py", ref_source("return torch.relu(x)"))
    write(root / "level1" / "2_Tanh.py", ref_source("return torch.tanh(x)"))
    write(root / "level1" / "1_Sigmoid.py", ref_source("return torch.sigmoid(x)"))
    write(root / "level2" / "3_Conv_ReLU.py", ref_source("return torch.relu(x) * 2"))
    write(root / "level2" / "21_Gemm_Add.py", ref_source("return x + 1"))
    write(root / "level2" / "__init__.py", "")
    return root


# --- KernelBench-style directories -----------------------------------------------------------

def test_kernelbench_dir_levels_names_and_natural_order(kb_dir: Path):
    tasks = load_kernelbench_dir(kb_dir)
    assert [(t.level, t.name) for t in tasks] == [
        (1, "1_Sigmoid"), (1, "2_Tanh"), (1, "10_ReLU"),
        (2, "3_Conv_ReLU"), (2, "21_Gemm_Add"),
    ]
    assert {t.group for t in tasks} == {"level1", "level2"}
    relu = tasks[2]
    assert relu.origin == str(kb_dir / "level1" / "10_ReLU.py")
    assert relu.source == (kb_dir / "level1" / "10_ReLU.py").read_text()


def test_kernelbench_dir_skips_underscore_files(kb_dir: Path):
    names = [t.name for t in load_kernelbench_dir(kb_dir)]
    assert "__init__" not in names


def test_kernelbench_dir_level_filter(kb_dir: Path):
    tasks = load_kernelbench_dir(kb_dir, levels=[2])
    assert [t.name for t in tasks] == ["3_Conv_ReLU", "21_Gemm_Add"]
    assert all(t.level == 2 for t in tasks)
    assert load_kernelbench_dir(kb_dir, levels=[3]) == []
    assert len(load_kernelbench_dir(kb_dir, levels=[1, 2])) == 5


def test_level_folder_given_as_root(kb_dir: Path):
    tasks = load_kernelbench_dir(kb_dir / "level2")
    assert [(t.level, t.name) for t in tasks] == [(2, "3_Conv_ReLU"), (2, "21_Gemm_Add")]


def test_level_comes_from_inside_the_root_only(tmp_path: Path):
    # A "levelN" folder above the root says nothing about the tasks below it, and the level
    # used for filtering agrees with the level recorded on the task.
    root = tmp_path / "level7" / "bench"
    write(root / "1_Top.py", GOOD)
    write(root / "level1" / "1_Inner.py", ref_source("return x * 3"))
    tasks = load_kernelbench_dir(root)
    assert [(t.level, t.name) for t in tasks] == [(None, "1_Top"), (1, "1_Inner")]
    assert [t.name for t in load_kernelbench_dir(root, levels=[1])] == ["1_Inner"]
    assert load_kernelbench_dir(root, levels=[7]) == []


def test_non_numeric_names_sort_after_numbered(tmp_path: Path):
    root = tmp_path / "kb"
    write(root / "level1" / "zeta.py", GOOD)
    write(root / "level1" / "3_c.py", ref_source("return x - 1"))
    write(root / "level1" / "alpha.py", ref_source("return x + 2"))
    assert [t.name for t in load_kernelbench_dir(root)] == ["3_c", "alpha", "zeta"]


def test_kernelbench_dir_not_a_directory(tmp_path: Path):
    with pytest.raises(TaskError, match="not a directory"):
        load_kernelbench_dir(tmp_path / "absent")


def test_ids_are_content_hashes(tmp_path: Path):
    a = load_task_file(write(tmp_path / "a" / "1_A.py", GOOD))
    b = load_task_file(write(tmp_path / "b" / "7_Other.py", GOOD))
    c = load_task_file(write(tmp_path / "c" / "1_A.py", GOOD + "\n# changed\n"))
    assert a.id == b.id == Task.source_hash(GOOD)
    assert a.id != c.id
    assert len(a.id) == 16 and int(a.id, 16) >= 0
    # The same code from a JSONL row gets the same id as from a file.
    jl = write(tmp_path / "t.jsonl", json.dumps({"code": GOOD}) + "\n")
    assert next(iter_jsonl_tasks(jl)).id == a.id


def test_task_is_frozen(tmp_path: Path):
    task = load_task_file(write(tmp_path / "1_A.py", GOOD))
    with pytest.raises(pydantic.ValidationError):
        task.name = "other"
    with pytest.raises(pydantic.ValidationError):
        task.source = "x = 1"


def test_single_file_group_and_level(tmp_path: Path):
    task = load_task_file(write(tmp_path / "mine" / "5_Thing.py", GOOD))
    assert task.name == "5_Thing"
    assert task.level is None
    assert task.group == "mine"
    named = load_task_file(tmp_path / "mine" / "5_Thing.py", group="g", name="n")
    assert (named.group, named.name) == ("g", "n")


# --- malformed references --------------------------------------------------------------------

def test_syntax_error_names_file_and_line(tmp_path: Path):
    bad = write(tmp_path / "1_Bad.py", GOOD.replace("def get_inputs():", "def get_inputs(:"))
    line = GOOD.splitlines().index("def get_inputs():") + 1
    with pytest.raises(TaskError) as err:
        load_task_file(bad)
    msg = str(err.value)
    assert str(bad) in msg
    assert "syntax error" in msg
    assert f"line {line}" in msg


@pytest.mark.parametrize("missing, old, new", [
    ("Model", "class Model(nn.Module):", "class Net(nn.Module):"),
    ("get_inputs", "def get_inputs():", "def make_inputs():"),
    ("get_init_inputs", "def get_init_inputs():", "def init_inputs():"),
])
def test_missing_required_names(tmp_path: Path, missing: str, old: str, new: str):
    path = write(tmp_path / "1_Missing.py", GOOD.replace(old, new))
    with pytest.raises(TaskError) as err:
        load_task_file(path)
    msg = str(err.value)
    assert str(path) in msg
    assert f"missing {missing}" in msg


def test_required_names_may_be_assigned_or_imported():
    src = ("import torch\nfrom refs import Model\nget_inputs = lambda: [torch.ones(2)]\n"
           "get_init_inputs: list = []\n")
    validate_reference_source(src, "x.py")  # does not raise
    validate_reference_source("from refs import Model, get_inputs, get_init_inputs\n", "y.py")


def test_unreadable_path(tmp_path: Path):
    with pytest.raises(TaskError) as err:
        load_task_file(tmp_path / "nope.py")
    assert str(tmp_path / "nope.py") in str(err.value)
    assert "cannot read" in str(err.value)
    folder = tmp_path / "folder.py"
    folder.mkdir()
    with pytest.raises(TaskError, match="cannot read"):
        load_task_file(folder)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_permission_denied(tmp_path: Path):
    path = write(tmp_path / "1_A.py", GOOD)
    path.chmod(0)
    try:
        with pytest.raises(TaskError, match="cannot read"):
            load_task_file(path)
    finally:
        path.chmod(0o644)


def test_non_utf8_file(tmp_path: Path):
    path = tmp_path / "1_Latin.py"
    path.write_bytes(b"# caf\xe9\n" + GOOD.encode())
    with pytest.raises(TaskError) as err:
        load_task_file(path)
    assert str(path) in str(err.value)


def test_malformed_file_in_dir_names_that_file(kb_dir: Path):
    bad = write(kb_dir / "level1" / "5_Broken.py", "class Model:\n    pass\n")
    with pytest.raises(TaskError) as err:
        load_kernelbench_dir(kb_dir)
    assert str(bad) in str(err.value)
    assert "get_inputs" in str(err.value)


# --- Ops-6K rows: JSONL and Parquet ----------------------------------------------------------

def ops_rows() -> list[dict]:
    return [
        {"ops": '["torch.nn.Conv2d", "torch.relu"]', "data_source": "torch#12",
         "code": ref_source("return torch.relu(x)"), "difficulty": 3, "split": "train"},
        {"ops": '["torch.tanh"]', "data_source": "torch#13",
         "code": ref_source("return torch.tanh(x)"), "difficulty": 1, "split": "train"},
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    return write(path, "".join(json.dumps(r) + "\n" for r in rows))


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def check_ops_tasks(tasks: list[Task], path: Path) -> None:
    assert len(tasks) == 2
    first, second = tasks
    assert first.ops == ("torch.nn.Conv2d", "torch.relu")
    assert second.ops == ("torch.tanh",)
    assert isinstance(first.ops, tuple)
    assert first.data_source == "torch#12"
    assert first.name == "torch_12"
    assert first.group == "ops6k"
    assert first.origin == f"{path}#0"
    assert second.origin == f"{path}#1"
    assert first.metadata == {"difficulty": "3", "split": "train"}
    assert first.id == Task.source_hash(ops_rows()[0]["code"])
    assert first.level is None


def test_jsonl_rows(tmp_path: Path):
    path = write_jsonl(tmp_path / "ops.jsonl", ops_rows())
    check_ops_tasks(list(iter_jsonl_tasks(path)), path)


def test_parquet_rows(tmp_path: Path):
    path = write_parquet(tmp_path / "ops.parquet", ops_rows())
    check_ops_tasks(list(iter_parquet_tasks(path)), path)


def test_parquet_list_typed_ops(tmp_path: Path):
    rows = [{"ops": ["torch.matmul", "torch.add"], "data_source": "torch#1", "code": GOOD}]
    path = write_parquet(tmp_path / "ops.parquet", rows)
    (task,) = iter_parquet_tasks(path)
    assert task.ops == ("torch.matmul", "torch.add")


def test_jsonl_name_column_and_missing_data_source(tmp_path: Path):
    path = write_jsonl(tmp_path / "ops.jsonl", [
        {"code": GOOD, "name": "custom"},
        {"code": ref_source("return x * 2")},
    ])
    first, second = iter_jsonl_tasks(path)
    assert first.name == "custom"
    assert first.ops == () and first.data_source == ""
    assert second.name == "row1"


def test_ops_not_json_fall_back_to_comma_split(tmp_path: Path):
    path = write_jsonl(tmp_path / "ops.jsonl", [{"ops": "[torch.relu, torch.tanh]", "code": GOOD}])
    (task,) = iter_jsonl_tasks(path)
    assert task.ops == ("torch.relu", "torch.tanh")


def test_ops_json_string_is_one_op(tmp_path: Path):
    path = write_jsonl(tmp_path / "ops.jsonl", [{"ops": '"torch.relu"', "code": GOOD}])
    (task,) = iter_jsonl_tasks(path)
    assert task.ops == ("torch.relu",)


def test_jsonl_blank_lines_skipped(tmp_path: Path):
    rows = ops_rows()
    path = write(tmp_path / "ops.jsonl", "\n" + json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n\n")
    assert [t.data_source for t in iter_jsonl_tasks(path)] == ["torch#12", "torch#13"]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize("code", [None, "", "   \n"])
def test_row_without_code(tmp_path: Path, fmt: str, code):
    rows = ops_rows()
    rows[1]["code"] = code
    path = tmp_path / f"ops.{fmt}"
    (write_jsonl if fmt == "jsonl" else write_parquet)(path, rows)
    with pytest.raises(TaskError) as err:
        load_tasks(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "row 1" in msg
    assert "code" in msg


def test_row_with_bad_reference_names_file_and_row(tmp_path: Path):
    rows = ops_rows()
    rows[0]["code"] = "import torch\n"
    path = write_jsonl(tmp_path / "ops.jsonl", rows)
    with pytest.raises(TaskError) as err:
        load_tasks(path)
    assert f"{path}#0" in str(err.value)
    assert "missing Model" in str(err.value)


def test_bad_json_line_gives_line_number(tmp_path: Path):
    rows = ops_rows()
    path = write(tmp_path / "ops.jsonl",
                 json.dumps(rows[0]) + "\n" + json.dumps(rows[1]) + "\n{not json\n")
    with pytest.raises(TaskError) as err:
        load_tasks(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "line 3" in msg
    assert "invalid JSON" in msg


def test_json_line_that_is_not_an_object(tmp_path: Path):
    path = write(tmp_path / "ops.jsonl", json.dumps(ops_rows()[0]) + "\n[1, 2]\n")
    with pytest.raises(TaskError) as err:
        load_tasks(path)
    assert str(path) in str(err.value)
    assert "line 2" in str(err.value)


def test_corrupt_parquet(tmp_path: Path):
    path = write(tmp_path / "ops.parquet", "this is not parquet")
    with pytest.raises(TaskError) as err:
        load_tasks(path)
    assert str(path) in str(err.value)


# --- load_tasks dispatch ---------------------------------------------------------------------

def test_load_tasks_dispatch(tmp_path: Path, kb_dir: Path):
    single = write(tmp_path / "one" / "4_One.py", GOOD)
    jl = write_jsonl(tmp_path / "ops.jsonl", ops_rows())
    pq_path = write_parquet(tmp_path / "ops.parquet", ops_rows())

    (task,) = load_tasks(single)
    assert task.name == "4_One"
    assert load_tasks(str(single)) == [task]

    assert [t.name for t in load_tasks(kb_dir)] == [t.name for t in load_kernelbench_dir(kb_dir)]
    assert [t.name for t in load_tasks(kb_dir, levels=[1])] == ["1_Sigmoid", "2_Tanh", "10_ReLU"]

    from_jsonl = load_tasks(jl)
    from_parquet = load_tasks(pq_path)
    assert [t.data_source for t in from_jsonl] == ["torch#12", "torch#13"]
    assert [t.id for t in from_jsonl] == [t.id for t in from_parquet]
    assert [t.ops for t in from_jsonl] == [t.ops for t in from_parquet]


def test_load_tasks_missing_path(tmp_path: Path):
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(TaskError) as err:
        load_tasks(missing)
    assert str(missing) in str(err.value)
    assert "no such file" in str(err.value)


def test_load_tasks_unknown_suffix(tmp_path: Path):
    path = write(tmp_path / "tasks.csv", "ops,code\n")
    with pytest.raises(TaskError) as err:
        load_tasks(path)
    assert str(path) in str(err.value)
    assert "unknown task format" in str(err.value)


def test_task_error_is_value_error():
    assert issubclass(TaskError, ValueError)


def test_jsonl_non_utf8_line(tmp_path: Path):
    path = tmp_path / "ops.jsonl"
    path.write_bytes(json.dumps(ops_rows()[0]).encode() + b"\n" + b'{"code": "caf\xe9"}\n')
    with pytest.raises(TaskError) as err:
        load_tasks(path)
    assert str(path) in str(err.value)
    assert "line 2" in str(err.value)
