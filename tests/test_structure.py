"""The package's shape, read from the code with ``ast`` (nothing imported): no import loop (imports inside
functions count), no private name imported from another autotune module, no module attribute of another
module assigned (patching), no function over 100 lines (a file's length is free), each folder importing only the
folders below it; and ``ruff check`` (pyproject.toml's ``[tool.ruff]``) finds nothing."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "autotune"
MAX_FUNCTION_LINES = 100  # aim for 60; a file's length is free (one job, however long)


def _modules() -> dict[str, Path]:
    mods = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


MODS = _modules()


def _target(mod: str, node: ast.ImportFrom) -> str:
    pkg = mod.split(".") if MODS[mod].name == "__init__.py" else mod.split(".")[:-1]
    if node.level:
        base = pkg[: len(pkg) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module or ""


def _imports(mod: str) -> tuple[set[str], list[str], set[str]]:
    """(modules imported, private names imported from other autotune modules, local names bound to modules)."""
    edges, private, bound = set(), [], set()
    for n in ast.walk(ast.parse(MODS[mod].read_text())):
        if isinstance(n, ast.ImportFrom):
            tgt = _target(mod, n)
            if not tgt.startswith("autotune"):
                continue
            for a in n.names:
                if f"{tgt}.{a.name}" in MODS:
                    edges.add(f"{tgt}.{a.name}")
                    bound.add(a.asname or a.name)
                elif tgt in MODS:
                    edges.add(tgt)
                    if a.name.startswith("_") and not a.name.startswith("__") and tgt != mod:
                        private.append(f"{mod}: from {tgt} import {a.name}")
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.name in MODS:
                    edges.add(a.name)
                    bound.add(a.asname or a.name.split(".")[-1])
    edges.discard("autotune")  # the package's lazy re-exports
    return edges, private, bound


def test_no_import_loop_counting_imports_inside_functions():
    graph = {m: _imports(m)[0] for m in MODS}
    loops, state, stack = [], {}, []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                loops.append(" -> ".join(stack[stack.index(v):] + [v]))
            elif not state.get(v):
                visit(v)
        stack.pop()
        state[u] = 2

    for m in sorted(graph):
        if not state.get(m):
            visit(m)
    assert loops == []


def test_no_private_name_is_imported_from_another_module():
    assert [p for m in MODS for p in _imports(m)[1]] == []


def test_nothing_assigns_another_modules_attributes():
    patched = []
    for m, path in MODS.items():
        bound = _imports(m)[2]
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Assign):
                patched += [f"{m}:{n.lineno}" for t in n.targets if isinstance(t, ast.Attribute)
                            and isinstance(t.value, ast.Name) and t.value.id in bound]
    assert patched == []


def _long_functions(path: Path, limit: int) -> list[str]:
    """Functions (and methods) longer than ``limit`` lines, from their ``def`` to their last line; a class's
    methods count on their own, a function's nested functions within it."""
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = n.end_lineno - n.lineno + 1
            if length > limit:
                out.append(f"{path.relative_to(PKG.parent)}:{n.lineno} {n.name} ({length} lines)")
    return out


@pytest.mark.parametrize("mod", sorted(MODS))
def test_no_function_is_longer_than_a_screenful(mod):
    assert _long_functions(MODS[mod], MAX_FUNCTION_LINES) == []


def test_the_check_sees_a_loop_and_a_private_import(tmp_path, monkeypatch):
    """The checks above can fail: on a two-module package with both faults they report them."""
    pkg = tmp_path / "autotune"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import _g\n")
    (pkg / "b.py").write_text("from . import a\n\ndef _g():\n    a.x = 1\n")
    here = __import__(__name__, fromlist=["MODS"])
    monkeypatch.setattr(here, "PKG", pkg)
    monkeypatch.setattr(here, "MODS", _modules())
    with pytest.raises(AssertionError):
        test_no_import_loop_counting_imports_inside_functions()
    with pytest.raises(AssertionError):
        test_no_private_name_is_imported_from_another_module()
    with pytest.raises(AssertionError):
        test_nothing_assigns_another_modules_attributes()
    (pkg / "c.py").write_text("def long():\n" + "    x = 1\n" * 101)
    assert _long_functions(pkg / "c.py", MAX_FUNCTION_LINES) == ["autotune/c.py:1 long (102 lines)"]


# Each folder imports only downward (its __init__ docstring says so): cli -> view -> search -> trial ->
# workloads -> machine -> the records at the top. The top's public door (api, recommendation, applied and the
# package's lazy __init__, provenance, distributed) may import any folder but cli; integrations sit beside view.
RECORDS = {"config", "result", "measure", "errors", "_records", "_units", "_atomic", "_redact", "_yaml"}
DOOR = {"", "api", "recommendation", "applied", "provenance", "distributed"}
ALLOWED = {
    "machine": set(),
    "field": {"machine"},  # the user's run, measured: called by the door (recommendation, applied)
    "workloads": {"machine"},
    "trial": {"workloads", "machine"},
    "search": {"trial", "workloads", "machine"},
    "view": {"search", "trial", "workloads", "machine", "field"},
    "integrations": {"search", "trial", "workloads", "machine", "field"},
    "cli": {"view", "search", "trial", "workloads", "machine", "integrations", "field"},
}


def _layer(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) > 1 and parts[1] in ALLOWED:
        return parts[1]
    return "records" if len(parts) > 1 and parts[1] in RECORDS else "door"


def test_each_folder_imports_only_downward():
    wrong = []
    for mod in MODS:
        src = _layer(mod)
        for dst_mod in _imports(mod)[0]:
            dst = _layer(dst_mod)
            if (dst == src or dst == "records" or (src == "door" and dst != "cli")
                    or (src in ALLOWED and dst in ALLOWED[src])):
                continue
            if (src in ALLOWED and dst == "door" and dst_mod.split(".")[-1] in DOOR - {""}
                    and src in ("cli", "integrations", "view", "search")):
                continue  # the recommendation record is read by the search (finalists) and written out by views
            wrong.append(f"{mod} ({src}) imports {dst_mod} ({dst})")
    assert wrong == []


# Inside search/, each room imports only the rooms before it (each room's __init__ docstring says so): the study
# as stored (record) and what may be tried (space) import nothing else in search; after the search (choose) reads
# the record; the search itself (plan) reads those three; where trials run (backends) reads the plan too; the
# tuner at the door (search/tuner.py, search/__init__.py) may import any room. The run's time budget
# (search/budget.py, one frozen record) imports nothing in search, and every room may read it.
SEARCH_ALLOWED = {
    "budget": set(),
    "record": {"budget"},
    "space": {"budget"},
    "choose": {"budget", "record"},
    "plan": {"budget", "record", "space", "choose"},
    "backends": {"budget", "record", "space", "plan"},
}


def _search_room(mod: str) -> str | None:
    """``record``, ``space``, ... for a module in one of search/'s rooms; "door" for search/'s own modules; None
    outside search/."""
    parts = mod.split(".")
    if parts[:2] != ["autotune", "search"]:
        return None
    if parts[2:] == ["budget"]:
        return "budget"
    return parts[2] if len(parts) > 3 and parts[2] in SEARCH_ALLOWED else "door"


def _search_layering_faults(mods: list[str]) -> list[str]:
    wrong = []
    for mod in mods:
        src = _search_room(mod)
        if src in (None, "door"):
            continue
        for dst_mod in _imports(mod)[0]:
            dst = _search_room(dst_mod)
            if dst is None or dst == src or dst in SEARCH_ALLOWED[src]:
                continue
            wrong.append(f"{mod} ({src}) imports {dst_mod} ({dst})")
    return wrong


def test_each_room_of_search_imports_only_the_rooms_before_it():
    assert _search_layering_faults(list(MODS)) == []


def test_search_holds_its_door_and_its_rooms_only():
    """search/ itself keeps at most 3 modules beside its rooms (its __init__ and the tuner at the door), and every
    room's __init__ names what it may import."""
    top = sorted(p.name for p in (PKG / "search").glob("*.py"))
    assert len(top) <= 3, top
    for room in set(SEARCH_ALLOWED) - {"budget"}:
        doc = ast.get_docstring(ast.parse((PKG / "search" / room / "__init__.py").read_text())) or ""
        assert "May import" in doc, room


def test_the_layering_check_sees_a_record_module_importing_the_plan(tmp_path, monkeypatch):
    """The check above can fail: a module of record/ that imports one of plan/ (planted in a copy) is reported."""
    import shutil

    pkg = tmp_path / "autotune"
    shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    planted = pkg / "search" / "record" / "trials.py"
    planted.write_text(planted.read_text() + "\n\ndef _planted():\n    from autotune.search.plan import coordinate\n")
    here = __import__(__name__, fromlist=["MODS"])
    monkeypatch.setattr(here, "PKG", pkg)
    monkeypatch.setattr(here, "MODS", _modules())
    assert _search_layering_faults(list(here.MODS)) == [
        "autotune.search.record.trials (record) imports autotune.search.plan.coordinate (plan)"]
    with pytest.raises(AssertionError):
        test_each_room_of_search_imports_only_the_rooms_before_it()


def test_ruff_is_clean():
    # ruff is a binary in a wheel: its package being found is what says the binary is there
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e .[dev])")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "autotune", "tests", "benchmarks", "examples"],
                         cwd=PKG.parent, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


# --- rooms doing one job each (issue 52 item 11) -----------------------------------------------------------------

def _defined(path: Path) -> set[str]:
    """The names a module defines at its top: functions, classes and assigned names."""
    body = ast.parse(path.read_text()).body
    return ({n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
            | {t.id for n in body if isinstance(n, (ast.Assign, ast.AnnAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)})


# what the confirmation does, a module each: its rounds, the record they leave, the recommendation rewritten with
# it, and the finalists' time plan (which keeps the confirmation's time back) beside the finalists
CONFIRM_JOBS = {"confirm": {"confirm", "confirmed", "planned_rounds", "MIN_ROUNDS", "MAX_ROUNDS"},
                "confirmation": {"Confirmation", "unconfirmed_line", "NOISY"},
                "rewrite": {"apply", "selection_record"},
                "time_plan": {"plan_finalists", "expected_round_s", "rerun_wall_s", "CACHED_COMPILE_SHARE"}}


def test_the_confirmation_keeps_each_of_its_jobs_in_a_module_of_its_own():
    choose = sorted((PKG / "search" / "choose").glob("*.py"))
    found = {name: [p.stem for p in choose if name in _defined(p)] for names in CONFIRM_JOBS.values() for name in names}
    assert found == {name: [mod] for mod, names in CONFIRM_JOBS.items() for name in names}


def _bools_entered(path: Path) -> list[str]:
    """Names that a function of ``path`` takes as a ``bool`` and a ``with`` enters: one name, two things."""
    tree = ast.parse(path.read_text())
    bools = {a.arg for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
             for a in n.args.args + n.args.kwonlyargs + n.args.posonlyargs
             if isinstance(a.annotation, ast.Name) and a.annotation.id == "bool"
             or isinstance(a.annotation, ast.Constant) and a.annotation.value == "bool"}
    entered = {item.context_expr.id for n in ast.walk(tree) if isinstance(n, (ast.With, ast.AsyncWith))
               for item in n.items if isinstance(item.context_expr, ast.Name)}
    return sorted(bools & entered)


def test_no_name_is_a_bool_in_one_function_and_a_context_manager_in_another():
    assert {m: names for m, p in MODS.items() if (names := _bools_entered(p))} == {}


def test_no_module_of_the_product_reads_the_kill_benchmarks_hold():
    """How long a phase holds once recorded is the kill benchmark's (benchmarks/kill_launch.py), not autotune's."""
    assert [m for m, p in MODS.items() if "AUTOTUNE_PHASE_HOLD_S" in p.read_text()] == []
