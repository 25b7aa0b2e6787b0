"""The ``dhim-ray`` CLI in a fresh process per run, forked from one that has already imported
what the commands import (torch, transformers, pymilvus, pyarrow): each run is still its own
process, with its own stdout, stderr and exit status, but starts in milliseconds instead of
two seconds. ``test_bad_input`` runs ~200 mistakes this way.

Run as a script, this file is that parent: it reads one JSON request per line on stdin
(``argv``, and the files to send the run's stdout and stderr to) and answers one JSON line
with the run's exit status. Anything the imports print fails its start: a line printed on
import would be a second line on every command's stderr."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path


class ForkedCLI:
    """The parent process, started once; ``run`` forks one CLI run from it."""

    def __init__(self, env: dict[str, str], workdir: Path, cwd: Path | None = None):
        """``workdir``: where each run's output goes; ``cwd``: the folder the runs start in."""
        self.workdir = workdir
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the CLI's parent process did not start: {ready!r} {self.proc.stderr.read()[-2000:]}")
        self.count = 0

    def run(self, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        """One CLI run, as ``subprocess.run([python, -m, dhim_ray.cli, *argv], capture_output=True)``."""
        self.count += 1
        out, err = self.workdir / f"{self.count}.out", self.workdir / f"{self.count}.err"
        self.proc.stdin.write(json.dumps({"argv": argv, "stdout": str(out), "stderr": str(err),
                                          "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the CLI's parent process ended: {self.proc.stderr.read()[-2000:]}")
        code = json.loads(answer)["returncode"]
        return subprocess.CompletedProcess(argv, code, out.read_text(errors="replace"), err.read_text(errors="replace"))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        if self.proc.returncode != 0:
            raise RuntimeError(f"the CLI's parent process failed: {self.proc.stderr.read()[-2000:]}")


#: What the commands import, done once in the parent (each takes a command 0.1 to 3 s).
PRELOADED = ("numpy", "pyarrow", "torch", "pymilvus", "transformers.models.bert.modeling_bert",
             "transformers.models.bert.tokenization_bert", "transformers.models.auto.modeling_auto",
             "transformers.models.auto.tokenization_auto", "dhim_ray.cli", "dhim_ray.search", "dhim_ray.evaluation", "dhim_ray.eval_in_milvus",
             "dhim_ray.training.pipeline", "dhim_ray.connectors.milvus", "dhim_ray.jobs.ingest", "dhim_ray.jobs.train")


def _child(request: dict) -> None:
    """In the forked process: stdin from /dev/null, stdout and stderr to the request's files,
    then the CLI's own entry point; it ends as ``python -m dhim_ray.cli`` would (its SystemExit's
    status, or an uncaught error's traceback and status 1)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115  (this process' own, until it ends)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.argv = ["dhim-ray", *request["argv"]]
    from dhim_ray.cli import main

    try:
        main(request["argv"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    # what the interpreter does on exit (threads joined, atexit: Ray's shutdown), without
    # tearing down the parent's thousands of modules one by one
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve() -> None:
    import tempfile

    answers = os.fdopen(os.dup(1), "w")
    saved = os.dup(2)
    with tempfile.TemporaryFile() as printed:
        os.dup2(printed.fileno(), 2)
        import importlib

        for module in PRELOADED:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError:  # another transformers' layout: that run imports it itself
                pass
            except Exception:
                traceback.print_exc()
        sys.stderr.flush()
        os.dup2(saved, 2)
        printed.seek(0)
        text = printed.read().decode(errors="replace")
    answers.write("ready\n" if not text else json.dumps(f"the imports printed on stderr: {text[-2000:]}") + "\n")
    answers.flush()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)  # never returns
        deadline = time.monotonic() + request["timeout"]
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.01)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as ``python -m`` has it, not this file's folder
    _serve()
