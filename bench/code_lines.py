"""The product's code lines, as the house's budget counts them: every line of dhim_ray/,
connectors/ and jobs/ holding a token, docstrings and comments left out (CONTRIBUTING.md, Budgets).

    python bench/code_lines.py            # HEAD
    python bench/code_lines.py REV -v     # another commit, with its 25 largest files
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize

FOLDERS = ("dhim_ray", "connectors", "jobs")


def code_lines(source: str) -> int:
    """Lines holding a token that is not a comment, outside every module, class and function docstring."""
    docs: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docs.update(range(first.lineno, first.end_lineno + 1))
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    lines = {n for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type not in skip
             for n in range(tok.start[0], tok.end[0] + 1)}
    return len(lines - docs)


def per_file(rev: str) -> dict[str, int]:
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, *FOLDERS], capture_output=True, text=True,
                           check=True).stdout.split()
    return {name: code_lines(subprocess.run(["git", "show", f"{rev}:{name}"], capture_output=True, text=True,
                                            check=True).stdout) for name in names if name.endswith(".py")}


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "-v"]
    counts = per_file(args[0] if args else "HEAD")
    if "-v" in sys.argv:
        for name, n in sorted(counts.items(), key=lambda x: -x[1])[:25]:
            print(f"{n:6,}  {name}")
    print(f"{sum(counts.values()):,} code lines")


if __name__ == "__main__":
    main()
