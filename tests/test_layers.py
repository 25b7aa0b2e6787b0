"""The architecture's layers only point down, checked on every import statement in
the source (module level and inside functions), and on what importing really loads.

    core        dhim_ray/{corpus,encoding,model,training,retrieval}/, config, errors, hasher
                                        torch, numpy, transformers; never Ray, pymilvus
    connectors  connectors/ (dhim_ray.connectors)   pymilvus, numpy; never torch or Ray
    search      dhim_ray/search.py, evaluation.py, eval_in_milvus.py   core + connectors; never Ray
    jobs        jobs/ (dhim_ray.jobs)   Ray programs joining them
    cli         dhim_ray/cli.py (cli_tables.py, cli_words.py)   on top; imported by nothing
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = {"cli", "cli_tables", "cli_words", "search", "evaluation", "eval_in_milvus"}  # modules of dhim_ray/ above the core


def layer_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "connectors":
        return "connectors"
    if rel.parts[0] == "jobs":
        return "jobs"
    if path.stem in TOP and path.parent.name == "dhim_ray":
        return "search" if path.stem in ("evaluation", "eval_in_milvus") else "cli" if path.stem.startswith("cli") \
            else path.stem
    return "core"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in ("connectors", "jobs"):
        parts = ["dhim_ray", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names, resolved to absolute names."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                found.update(f"{mod}.{a.name}" for a in node.names)  # "from . import x" imports a module
                found.add(mod)
            else:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


SOURCES = [p for folder in ("dhim_ray", "connectors", "jobs") for p in sorted((ROOT / folder).rglob("*.py"))]
FORBIDDEN = {
    "core": ("ray", "pymilvus", "milvus_lite", "dhim_ray.connectors", "dhim_ray.jobs", "dhim_ray.search",
             "dhim_ray.evaluation", "dhim_ray.eval_in_milvus", "dhim_ray.cli"),
    "connectors": ("ray", "torch", "transformers", "dhim_ray.model", "dhim_ray.encoding", "dhim_ray.training",
                   "dhim_ray.hasher", "dhim_ray.jobs", "dhim_ray.search", "dhim_ray.cli"),
    "search": ("ray", "dhim_ray.jobs", "dhim_ray.cli"),
    "jobs": ("dhim_ray.cli", "dhim_ray.cli_tables", "dhim_ray.cli_words"),
    "cli": (),
}


def test_the_sources_are_found():
    layers = {layer_of(p) for p in SOURCES}
    assert layers == set(FORBIDDEN) and len(SOURCES) > 20


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_layers_only_point_down(path):
    layer = layer_of(path)
    bad = sorted(m for m in imports_of(path) for f in FORBIDDEN[layer] if m == f or m.startswith(f + "."))
    assert not bad, f"{layer} module {path.relative_to(ROOT)} imports {bad}"


#: The rooms of the core, lowest first: a module imports only from its own room and lower ones.
#: (errors, folders and the code format are vocabulary every room shares.)
ROOMS = ("shared", "corpus", "config", "encoding", "model", "retrieval", "training", "application")
SHARED = {"errors", "folders", "codes"}


def room_of(module: str) -> str | None:
    """The core room of a dhim_ray module (None: not in the core, or the package itself)."""
    parts = module.split(".")
    if parts[0] != "dhim_ray" or len(parts) < 2 or parts[1] in ("connectors", "jobs", *TOP):
        return None
    if parts[1] in SHARED:
        return "shared"
    return parts[1] if parts[1] in ROOMS else "application"  # hasher, eval_in_memory, embedding, export


CORE = [p for p in SOURCES if layer_of(p) == "core" and p.name != "__init__.py"]


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_rooms_of_the_core_only_point_down(path):
    """corpus < config < encoding < model < retrieval < training < application (hasher,
    eval_in_memory, embedding, export): inference lives with the model, not in training."""
    mine = room_of(module_name(path))
    up = sorted(m for m in imports_of(path) if room_of(m) and ROOMS.index(room_of(m)) > ROOMS.index(mine))
    assert not up, f"{path.relative_to(ROOT)} ({mine}) imports from higher rooms: {up}"


def test_the_room_checker_knows_every_room():
    assert {room_of(module_name(p)) for p in CORE} == set(ROOMS)
    assert room_of("dhim_ray.model.inference") == "model" and room_of("dhim_ray.hasher") == "application"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_of_the_bare_folder_names(path):
    """connectors/ and jobs/ install as dhim_ray.connectors / dhim_ray.jobs: a bare
    'import jobs' would pick up whatever other project owns that name."""
    bare = sorted(m for m in imports_of(path) if m.split(".")[0] in ("connectors", "jobs"))
    assert not bare, f"{path.relative_to(ROOT)} imports {bare}"


def test_the_import_checker_sees_imports_inside_functions(tmp_path):
    probe = ROOT / "dhim_ray" / "_probe_for_test.py"
    probe.write_text("def f():\n    import ray\n    from .jobs.train import x\n")
    try:
        found = imports_of(probe)
    finally:
        probe.unlink()
    assert "ray" in found and "dhim_ray.jobs.train" in found


def loaded_by(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(','.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True)
    return set(out.stdout.strip().split(","))


def test_importing_the_core_loads_neither_ray_nor_pymilvus():
    core = [module_name(p) for p in SOURCES if layer_of(p) == "core" and p.name != "__init__.py"]
    loaded = loaded_by("; ".join(f"import {m}" for m in core))
    assert "torch" in loaded  # the core did load
    assert "ray" not in loaded and "pymilvus" not in loaded


def test_importing_the_connector_loads_no_torch():
    loaded = loaded_by("import dhim_ray.connectors.milvus; import pymilvus")
    assert "pymilvus" in loaded
    assert "torch" not in loaded and "transformers" not in loaded


def test_importing_what_a_search_runs_loads_no_torch():
    """The one-shot search path (the command, the Searcher, the query graph) imports neither torch
    nor transformers: they load only where something asks for them (a graph to make, a re-rank)."""
    loaded = loaded_by("import dhim_ray.cli, dhim_ray.search, dhim_ray.graph_hasher, dhim_ray.model.checkpoint")
    assert "dhim_ray" in loaded and "numpy" in loaded
    assert "torch" not in loaded and "transformers" not in loaded


def long_docstrings(source: str) -> list[str]:
    """Docstrings past the house's length: a private function's or class's past one line, any past six."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or not node.body:
            continue
        first = node.body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)):
            continue
        name = getattr(node, "name", "<module>")
        private = name.startswith("_") and not name.startswith("__")
        lines = first.end_lineno - first.lineno + 1
        if lines > (1 if private else 6):
            found.append(f"{name}: {lines} lines")
    return found


def test_the_docstring_checker_finds_a_long_one():
    assert long_docstrings('def _f():\n    """one\n    two"""\n') == ["_f: 2 lines"]
    assert long_docstrings('def f():\n    """' + "\n" * 6 + '"""\n') == ["f: 7 lines"]
    assert long_docstrings('def _f():\n    """one"""\ndef f():\n    """1\n2\n3\n4\n5\n6"""\n') == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docstrings_fit_the_house(path):
    """Public: what, arguments, returns, raises, an example, in six lines at most; private: one line.
    The design and the measured figures they would otherwise carry live in docs/ and BENCHMARKS.md."""
    found = long_docstrings(path.read_text())
    assert not found, f"{path.relative_to(ROOT)}: {found}"


# ---- the house's budgets (CONTRIBUTING.md) ------------------------------------------------------
MAX_FILE_LINES, MAX_FUNCTION_LINES, MAX_COMMAND_LINES = 600, 60, 19
#: Rooms still over a budget, at their size when the budget came: each may only shrink, and leaves
#: this table (the test says so) once it fits.
OVER_BUDGET: dict[str, int] = {}


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's body in lines, its docstring left out."""
    body = node.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
        and isinstance(body[0].value.value, str)
    start = (body[1].lineno if len(body) > 1 else body[0].end_lineno) if has_doc else body[0].lineno
    return node.end_lineno - start + 1


def budgets(path: Path) -> dict[str, tuple[int, int]]:
    """What of ``path`` a budget weighs: name -> (its lines, the budget)."""
    rel, source = str(path.relative_to(ROOT)), path.read_text()
    out = {rel: (len(source.splitlines()), MAX_FILE_LINES)}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            command = rel == "dhim_ray/cli.py" and any(
                isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "command" for d in node.decorator_list)
            out[f"{rel}:{node.name}"] = (body_lines(node), MAX_COMMAND_LINES if command else MAX_FUNCTION_LINES)
    return out


def test_the_budget_checker_counts_a_body_without_its_docstring():
    node = ast.parse('def f():\n    """Doc."""\n    a = 1\n    return a\n').body[0]
    assert body_lines(node) == 2


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_rooms_and_functions_fit_their_budgets(path):
    """No product file over 600 lines, no function body over 60, no command body over 19; a room
    in OVER_BUDGET may not grow, and must leave the table once it fits."""
    for name, (lines, budget) in budgets(path).items():
        if name in OVER_BUDGET:
            assert budget < lines <= OVER_BUDGET[name], f"{name}: {lines} lines (budget {budget}, table " \
                                                         f"{OVER_BUDGET[name]}): shrink it, or drop it from OVER_BUDGET"
        else:
            assert lines <= budget, f"{name}: {lines} lines, over its budget of {budget}"
