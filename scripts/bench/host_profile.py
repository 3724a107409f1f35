"""Where a training step's host time goes: a py-spy recording cut to the steady-state steps.

    python scripts/bench/host_profile.py --out DIR -- python -m rocmtrain recipe=dlrm_dcnv2_h200 ...
    python scripts/bench/host_profile.py --raw DIR/pyspy.txt        # summarise a recording again

When the GPU step is short, the host's time per step decides the rate (BENCHMARKS.md: 17-24 ms
of host time against a 21 ms GPU step). ``torch.profiler`` shows the ops the host launched, not
the Python around them; py-spy samples the Python stacks of the running process from outside,
at a fixed rate, without instrumenting it. The summary keeps the samples taken inside a training
step (a frame named ``--step-frame``) and drops the
ones compiling (Dynamo/Inductor frames), so warm-up and ``torch.compile`` do not drown the
steady state. The default step frame, Lightning's per-batch ``_TrainingEpochLoop.advance``, holds
the whole step: fetching the batch, the hooks, forward, backward, the optimizer. Output: ``DIR/pyspy.txt`` (py-spy's raw format: one ``frame;frame;... count``
line per stack) and ``DIR/host_profile.md`` (share of the step samples per function, inclusive
and self, and per library). py-spy is a benchmark tool, not a rocmtrain dependency:
``pip install py-spy``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

COMPILING = (
    "torch/_dynamo/convert_frame",
    "torch/_inductor/compile_fx",
    "torch/_inductor/codecache",
)
"""Frames of a stack that is compiling, not running, a step."""

LIBRARIES = (
    ("rocmtrain", "rocmtrain/"),
    ("torchrec", "torchrec/"),
    ("fbgemm_gpu", "fbgemm_gpu/"),
    ("torchmetrics", "torchmetrics/"),
    ("lightning", "lightning/"),
    ("inductor runtime", "torch/_inductor/"),
    ("dynamo guards/eval", "torch/_dynamo/"),
    ("autograd", "torch/autograd/"),
    ("torch.optim", "torch/optim/"),
    ("torch (other)", "torch/"),
    ("triton", "triton/"),
)
"""Library of a frame (first match on its file path; ``lightning/`` also matches
``pytorch_lightning/``)."""

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def parse_raw(text: str) -> list[tuple[list[str], int]]:
    """py-spy's raw (collapsed) lines -> ``[(frames outermost first, count)]``."""
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def frame_key(frame: str) -> tuple[str, str]:
    """``'f (path/x.py:12)'`` -> ``('f', 'path/x.py')`` (the line dropped: one row per function)."""
    m = _FRAME.match(frame)
    return (m["func"], m["file"]) if m else (frame, "")


def library(file: str) -> str:
    for name, marker in LIBRARIES:
        if marker in file:
            return name
    return "other"


def _is_step(func: str, step_frame: str) -> bool:
    # py-spy names methods Class.method: "advance" matches "_TrainingEpochLoop.advance"
    return func == step_frame or func.endswith("." + step_frame)


def step_samples(
    stacks: list[tuple[list[str], int]], step_frame: str
) -> list[tuple[list[str], int]]:
    """The stacks inside a step, from the step frame inwards, that are not compiling."""
    out = []
    for frames, count in stacks:
        idx = next((i for i, f in enumerate(frames) if _is_step(frame_key(f)[0], step_frame)), None)
        if idx is None or any(c in f for f in frames for c in COMPILING):
            continue
        out.append((frames[idx:], count))
    return out


def summarise(stacks: list[tuple[list[str], int]], *, step_frame: str, top: int = 40) -> str:
    steps = step_samples(stacks, step_frame)
    total = sum(c for _, c in steps)
    all_samples = sum(c for _, c in stacks)
    if total == 0:
        return (
            f"# Host profile\n\nNo sample inside a `{step_frame}` frame ({all_samples} samples "
            "in all): pass the frame that runs one step with --step-frame.\n"
        )
    inclusive: Counter = Counter()
    self_time: Counter = Counter()
    libs_self: Counter = Counter()
    for frames, count in steps:
        for key in {frame_key(f) for f in frames}:
            inclusive[key] += count
        leaf = frame_key(frames[-1])
        self_time[leaf] += count
        libs_self[library(leaf[1])] += count

    def pct(n: int) -> str:
        return f"{100.0 * n / total:.1f} %"

    lines = [
        "# Host profile (py-spy, steady-state steps)",
        "",
        f"{total} samples inside `{step_frame}` and not compiling, of {all_samples} in all.",
        "Shares are of the step samples: the host time of a step, wherever it went "
        "(a GPU wait shows as the frame that waited).",
        "",
        "## Self time per library (the innermost Python frame's file)",
        "",
        "| library | self |",
        "|---|---:|",
        *(f"| {lib} | {pct(n)} |" for lib, n in libs_self.most_common()),
        "",
        f"## Inclusive time, top {top}",
        "",
        "| function | file | inclusive | self |",
        "|---|---|---:|---:|",
        *(
            f"| `{func}` | {file} | {pct(n)} | {pct(self_time[(func, file)])} |"
            for (func, file), n in inclusive.most_common(top)
        ),
        "",
        f"## Self time, top {top}",
        "",
        "| function | file | self |",
        "|---|---|---:|",
        *(f"| `{func}` | {file} | {pct(n)} |" for (func, file), n in self_time.most_common(top)),
        "",
    ]
    return "\n".join(lines)


def record(out: Path, rate: int, command: list[str]) -> int:
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("host_profile.py: py-spy is not on PATH; pip install py-spy")
    raw = out / "pyspy.txt"
    # --nonblocking: read the stacks without pausing the process (a pause per sample would add
    # to the host time being measured); a torn stack now and then is the price
    cmd = [spy, "record", "--nonblocking", "-r", str(rate), "-f", "raw", "-o", str(raw)]
    cmd += ["--", *command]
    return subprocess.call(cmd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder for pyspy.txt and host_profile.md")
    ap.add_argument("--raw", type=Path, help="summarise this recording instead of recording")
    ap.add_argument("--rate", type=int, default=250, help="samples per second (default 250)")
    ap.add_argument(
        "--step-frame",
        default="_TrainingEpochLoop.advance",
        help="frame that runs one step (Class.method or method)",
    )
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to profile")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    rc = 0
    if args.raw is not None:
        raw, out = args.raw, args.out or args.raw.parent
    elif args.out is not None and command:
        out = args.out
        out.mkdir(parents=True, exist_ok=True)
        rc = record(out, args.rate, command)
        raw = out / "pyspy.txt"
    else:
        ap.error("give --out DIR -- COMMAND..., or --raw FILE")
    if not raw.is_file():
        raise SystemExit(f"host_profile.py: no recording at {raw} (the command exited {rc})")
    md = summarise(parse_raw(raw.read_text()), step_frame=args.step_frame, top=args.top)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_profile.md").write_text(md)
    print(md)
    return rc


if __name__ == "__main__":
    sys.exit(main())
