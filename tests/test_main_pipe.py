"""``python -m rocmtrain SUBCOMMAND ... | head -1``: a reader that goes away early ends the command
quietly (exit 141 as for a tool SIGPIPE ended, nothing on stderr), as other Unix tools do.

Real subprocesses whose stdout pipe the test closes after one line, with outputs far larger than
a pipe's buffer so that the command is still writing when the reader goes away.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocmtrain.__main__ import PIPE_CLOSED

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "diagnostics" / "corpus"
RCCL_LOG = REPO / "tests" / "fixtures" / "rccl_tests" / "rccl-tests_allreduce_mi300x_1.txt"
ROW = "{:12d} {:13d}     float     sum      -1    45.92    0.00    0.00      0    46.12    0.00    0.00      0"


def _head_1(args: list[str]) -> tuple[str, int, str]:
    """Run ``python -m rocmtrain ARGS | head -1``: first line, exit code, stderr."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmtrain", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader goes away, as head does after its line
    err = proc.stderr.read()
    return first, proc.wait(timeout=120), err


def _big_source(tmp_path: Path) -> Path:
    """A CUDA file with ~150 KB of scan findings (60 copies of the trap corpus)."""
    src = tmp_path / "many_traps.cu"
    src.write_text((CORPUS / "misc_traps.cu").read_text() * 60)
    return src


def _big_rccl_log(tmp_path: Path) -> Path:
    """An rccl-tests log with 1500 result rows (~470 KB as JSON): the recorded header and tail."""
    lines = RCCL_LOG.read_text().splitlines()
    head = [line for line in lines if line.startswith(("#", "rccl-tests"))][:20]
    tail = [line for line in lines if line.startswith(("# Errors", "# Out of", "# Avg"))]
    rows = [ROW.format(8 * i, 2 * i) for i in range(1, 1501)]
    log = tmp_path / "all_reduce.log"
    log.write_text("\n".join(head + rows + tail) + "\n")
    return log


@pytest.mark.parametrize("command", ["scan", "rccl-tests"])
def test_closed_pipe_ends_quietly(tmp_path: Path, command: str) -> None:
    if command == "scan":
        args = ["scan", "--no-hipify", str(_big_source(tmp_path))]
    else:
        args = ["rccl-tests", "parse", "--json", str(_big_rccl_log(tmp_path))]
    first, code, err = _head_1(args)
    assert first.strip(), "the command printed nothing before the pipe closed"
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert err == "", err
    assert code == PIPE_CLOSED
