"""Fake rccl-tests executables for the runner/sweep/CLI tests: real subprocesses, real fixture output.

Each fake is a small Python script with a shebang (an executable file, run without a shell) that prints a
real recorded log from tests/fixtures/rccl_tests/, optionally scaled, truncated, hanging or failing.
"""

from __future__ import annotations

import os
import stat
import sys
import textwrap
from pathlib import Path

MI300X_LOG = "rccl-tests_allreduce_mi300x_1.txt"


def write_fake(
    bin_dir: Path,
    name: str,
    *,
    fixture: Path,
    mode: str = "print",
    exit_code: int = 0,
    proto_scale: dict[str, float] | None = None,
    fail_protocols: tuple[str, ...] = (),
    help_style: str | None = None,
) -> Path:
    """Create ``bin_dir/name`` (e.g. ``all_reduce_perf``).

    mode: ``print`` (the whole log), ``hang`` (first 25 lines, then a child and itself sleep forever;
    the child's pid goes to ``<name>.child``), ``truncate`` (first 30 lines, then exit ``exit_code``).
    ``help_style`` (``nccl``/``rccl``) makes ``-h`` print that project's usage lines for file output
    and honours ``-J FILE`` (nccl-tests JSON) or ``-x FILE -Z csv`` (rccl-tests CSV).
    ``proto_scale`` multiplies the busbw/algbw columns of result rows by a factor chosen by $NCCL_PROTO
    (so a sweep has a known winner). The argv and NCCL_* env are appended to ``<name>.calls``.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    script = f"""\
        #!{sys.executable}
        import json, os, re, subprocess, sys, time
        calls = {str(bin_dir / (name + ".calls"))!r}
        with open(calls, "a") as f:
            env = {{k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "RCCL_"))}}
            f.write(json.dumps({{"argv": sys.argv[1:], "env": env}}) + "\\n")
        style = {help_style!r}
        if "-h" in sys.argv:
            if style == "nccl":
                print("[-J,--output_file <file> write output to filepath, if accessible. Infer type from suffix (only json supported presently.)]")
            if style == "rccl":
                print("[-x,--output_file <output file name>]\\n[-Z,--output_format <output format <csv|json>]")
            sys.exit(0)
        proto = os.environ.get("NCCL_PROTO", "unset")
        if proto in {list(fail_protocols)!r}:
            print("host: Test NCCL failure common.cu:392 'invalid usage' ", flush=True)
            sys.exit(3)
        scale = {dict(proto_scale or {})!r}.get(proto, 1.0)
        lines = open({str(fixture)!r}).read().splitlines()
        mode = {mode!r}
        if mode == "hang":
            lines = lines[:25]
        if mode == "truncate":
            lines = lines[:30]
        row = re.compile(r"^(\\s*\\d+\\s+\\d+\\s+\\S+\\s+\\S+\\s+-?\\d+)(.*)$")
        for line in lines:
            m = row.match(line)
            if m and scale != 1.0:
                t = m.group(2).split()
                for i in (1, 2, 5, 6):
                    t[i] = "%.2f" % (float(t[i]) * scale)
                for i in (0, 4):  # faster: the time shrinks by the same factor
                    t[i] = "%.2f" % (float(t[i]) / scale)
                line = m.group(1) + "  " + "  ".join(t)
            print(line, flush=True)
        data = [l.split() for l in lines if row.match(l)]
        if style == "nccl" and "-J" in sys.argv:
            blk = lambda t: {{"time": float(t[0]), "alg_bw": float(t[1]), "bus_bw": float(t[2]), "nwrong": float(t[3])}}
            res = [{{"size": int(t[0]), "count": int(t[1]), "type": t[2], "redop": t[3], "root": t[4],
                     "out_of_place": blk(t[5:9]), "in_place": blk(t[9:13])}} for t in data]
            doc = {{"version": 3, "args": sys.argv, "results": res, "out_of_bounds": {{"count": 0}}}}
            open(sys.argv[sys.argv.index("-J") + 1], "w").write(json.dumps(doc))
        if style == "rccl" and "-x" in sys.argv:
            with open(sys.argv[sys.argv.index("-x") + 1], "w") as f:
                f.write("collective, gpus, size, type, redop, inplace, time, algbw, busbw, #wrong\\n")
                for t in data:
                    for ip, b in ((0, t[5:9]), (1, t[9:13])):
                        f.write(", ".join(["AllReduce", "8", t[0], t[2], t[3], str(ip), *b]) + "\\n")
        if mode == "hang":
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            open(calls.replace(".calls", ".child"), "w").write(str(child.pid))
            time.sleep(600)
        sys.exit({exit_code})
        """
    path.write_text(textwrap.dedent(script))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by init) counts as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
