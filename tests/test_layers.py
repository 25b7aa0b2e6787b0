"""The architecture's boundaries: the library never imports Ray or pymilvus; the
connector never imports torch."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_in(cmd: str) -> set[str]:
    code = f"import sys; {cmd}; print(','.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.strip().split(","))


def test_library_imports_neither_ray_nor_pymilvus():
    modules = [p.stem for p in (ROOT / "dhim_ray").glob("*.py") if p.stem != "__init__"]
    loaded = imported_in("; ".join(f"import dhim_ray.{m}" for m in modules))
    assert "torch" in loaded  # sanity: the library did load
    assert "ray" not in loaded and "pymilvus" not in loaded


def test_connector_does_not_import_torch():
    loaded = imported_in("import dhim_ray.connectors.milvus")
    assert "pymilvus" in loaded or True  # pymilvus loads lazily on connect
    assert "torch" not in loaded and "transformers" not in loaded


def test_no_top_level_ray_or_milvus_imports_in_library_source():
    for path in (ROOT / "dhim_ray").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only; the CLI imports jobs inside commands
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in ("ray", "pymilvus", "jobs", "connectors"), f"{path.name}: {name}"
