"""End-to-end samples/s of the CPU recipe, measured through the real CLI.

    .venv/bin/python scripts/bench/bench_e2e_cpu.py                 # dlrm_cpu as shipped
    .venv/bin/python scripts/bench/bench_e2e_cpu.py --repeat 2 -- trainer.max_epochs=2
    .venv/bin/python scripts/bench/bench_e2e_cpu.py --json out.json

Runs ``python -m rocmtrain recipe=dlrm_cpu`` (2 gloo ranks, table-wise sharded embeddings,
synthetic planted-signal data) in a fresh run dir with ``checkpoint.resume=never``, and reports:
wall time of the whole command (startup, rank launch, planning, training, validation,
checkpoints), the global training samples/s of each epoch (the module measures it between the
first and last training batch of the epoch, so validation is excluded), the median over epochs
after the first (warm), and the final validation AUC. Prints a Markdown table row for
``scripts/bench/BENCHMARKS.md`` with the date, machine and versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as pyplatform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EPOCH = re.compile(r"^epoch (\d+)/\d+: (.*)$")


def parse_epochs(stdout: str) -> list[dict[str, float]]:
    """The per-epoch summary lines printed by rocmtrain's DLRMModule (rank 0)."""
    rows = []
    for line in stdout.splitlines():
        m = EPOCH.match(line.strip())
        if not m:
            continue
        row = {"epoch": float(m.group(1))}
        for key, value in re.findall(r"(\S+)=(\S+)", m.group(2)):
            row[key] = float(value.replace(",", ""))
        rows.append(row)
    return rows


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {pyplatform.system()} {pyplatform.machine()}"


def versions() -> str:
    from rocmtrain import platform

    names = ("torch", "torchrec", "fbgemm-gpu-cpu", "pytorch-lightning")
    return ", ".join(f"{n} {platform.package_version(n)}" for n in names)


def run_once(overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_e2e_") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "rocmtrain",
            "recipe=dlrm_cpu",
            f"run_dir={tmp}/run",
            "checkpoint.resume=never",
            "trainer.progress_bar=false",
            *overrides,
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        cpu = os.times()
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"bench: the run failed with exit code {proc.returncode}")
    epochs = parse_epochs(proc.stdout)
    rates = [e["samples/s"] for e in epochs]
    warm = rates[1:] or rates
    return {
        "wall_s": round(wall, 1),
        "children_cpu_s": round(cpu.children_user + cpu.children_system, 1),
        "samples_per_s_per_epoch": rates,
        "samples_per_s_warm_median": statistics.median(warm) if warm else None,
        "final_val_auc": epochs[-1].get("val_auc") if epochs else None,
        "epochs": epochs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs (the best wall time is reported)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides after --")
    args = ap.parse_args(argv)
    runs = [run_once(args.overrides) for _ in range(args.repeat)]
    best = min(runs, key=lambda r: r["wall_s"])
    result = {
        "command": "python -m rocmtrain recipe=dlrm_cpu " + " ".join(args.overrides),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "versions": versions(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 1),
        "runs": runs,
        "best": best,
    }
    print(json.dumps(result, indent=1))
    print(
        f"\n| {result['date']} | `{result['command'].strip()}` | {best['wall_s']} s "
        f"| {best['samples_per_s_warm_median']:,.0f} | {best['final_val_auc']:.4f} "
        f"| {result['machine']} | {result['versions']} |"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
