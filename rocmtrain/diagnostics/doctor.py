"""``python -m rocmtrain doctor``: is this machine ready to train? Each check: status, evidence, fix.

    python -m rocmtrain doctor                 # human-readable table
    python -m rocmtrain doctor --json          # {"checks": [...], "devices": [...], "summary": {...}}
    python -m rocmtrain doctor --headroom 0.2  # warn when a GPU has < 20 % memory free
    python -m rocmtrain doctor --tool-output rocminfo=node7_rocminfo.txt   # offline: saved outputs
    python -m rocmtrain doctor parse rocm-smi saved.txt --json
        # {"devices": [{index, gfx_arch, device_id, name, vram_total_bytes, power_w, temp_c,
        #               util_pct}], "warnings": [...]}   (hipify-stats: {files, converted, warnings, loc})

Statuses: ok, warn, error, skip. The exit code is 1 only when a check has status ``error``
(``HSA_OVERRIDE_GFX_VERSION`` on an Instinct GPU, torch blind to GPUs the driver sees, ...); version
mismatches against the compatibility table only warn. GPU facts come from torch, then amdsmi/pynvml,
then the CLIs (``rocminfo``, ``amd-smi``, ``rocm-smi``, ``nvidia-smi``) via header-driven parsers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from rocmtrain import exit_codes, platform
from rocmtrain.diagnostics.checks import STATUSES, Check, Inputs, run_checks
from rocmtrain.diagnostics.parsers import PARSERS, ParseError, parse
from rocmtrain.diagnostics.sources import CLI_COMMANDS, run_command

PARSE_KINDS = ("rocminfo", "rocm-smi", "amd-smi", "hipify-stats", "nvidia-smi")


def _parse_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="rocmtrain doctor parse", description="Parse a saved tool output (header-driven)."
    )
    ap.add_argument("kind", choices=PARSE_KINDS)
    ap.add_argument("file", type=Path)
    ap.add_argument("--json", action="store_true", help="print the JSON schema (default: table)")
    args = ap.parse_args(argv)
    try:
        text = args.file.read_text(errors="replace")
    except OSError as e:
        print(f"rocmtrain doctor parse: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return exit_codes.USAGE
    try:
        result = parse(args.kind, text)
    except ParseError as e:
        print(f"rocmtrain doctor parse: {args.file}: {e}", file=sys.stderr)
        return exit_codes.FAILURE
    data = result.to_schema()
    if args.json:
        print(json.dumps(data, indent=2))
    elif args.kind == "hipify-stats":
        for f in data["files"]:
            print(
                f"{f['file']}: converted={f['converted']} warnings={f['warnings']} loc={f['loc']}"
            )
        print(f"total: converted={data['converted']} warnings={data['warnings']} loc={data['loc']}")
    else:
        for d in data["devices"]:
            print("  ".join(f"{k}={v}" for k, v in d.items()))
        for w in data["warnings"]:
            print(f"warning: {w}")
    return exit_codes.OK


def _saved_runner(saved: dict[str, str]):
    by_prog = {CLI_COMMANDS[kind][0]: text for kind, text in saved.items()}

    def run(argv):
        return by_prog.get(argv[0])

    return run


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rocmtrain doctor",
        description="Check GPU, versions, env vars and node settings for training. "
        "Subcommand: `doctor parse KIND FILE [--json]`.",
    )
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument(
        "--headroom",
        type=float,
        default=None,
        help="fraction of GPU memory that must be free (default: monitor.memory_headroom_fraction)",
    )
    ap.add_argument(
        "--tool-output",
        action="append",
        default=[],
        metavar="KIND=FILE",
        help=f"use a saved output instead of running the tool (KIND: {', '.join(CLI_COMMANDS)}); "
        "disables live torch/amdsmi/NVML probing of GPUs",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "parse":
        return _parse_main(argv[1:])
    args = build_parser().parse_args(argv)
    from rocmtrain.config.monitor import MonitorConfig

    headroom = MonitorConfig().memory_headroom_fraction if args.headroom is None else args.headroom
    if not 0.0 <= headroom < 1.0:
        print(f"rocmtrain doctor: --headroom {headroom} must be in [0, 1)", file=sys.stderr)
        return exit_codes.USAGE
    saved: dict[str, str] = {}
    for item in args.tool_output:
        kind, _, file = item.partition("=")
        if kind not in CLI_COMMANDS or not file:
            print(
                f"rocmtrain doctor: --tool-output {item!r}: expected KIND=FILE with KIND in "
                f"{sorted(CLI_COMMANDS)}",
                file=sys.stderr,
            )
            return exit_codes.USAGE
        try:
            saved[kind] = Path(file).read_text(errors="replace")
        except OSError as e:
            print(f"rocmtrain doctor: cannot read {file}: {e.strerror}", file=sys.stderr)
            return exit_codes.USAGE
        try:  # a saved output the doctor cannot read must not turn into a check of this host
            parse(kind, saved[kind])
        except ParseError as e:
            print(f"rocmtrain doctor: --tool-output {kind}={file}: {e}", file=sys.stderr)
            return exit_codes.USAGE
    inputs = Inputs(headroom_fraction=headroom)
    if saved:
        inputs.run, inputs.live = _saved_runner(saved), False
    else:
        inputs.run = run_command
    facts, checks = run_checks(inputs)
    counts = Counter(c.status for c in checks)
    code = exit_codes.FAILURE if counts["error"] else exit_codes.OK
    if args.json:
        print(json.dumps(report_dict(facts, checks, code), indent=2))
    else:
        print(format_report(facts, checks, code))
    return code


def report_dict(facts, checks: list[Check], code: int) -> dict:
    counts = Counter(c.status for c in checks)
    return {
        "backend": facts.backend,
        "torch": ".".join(map(str, platform.torch_version())),
        "sources": facts.sources_used(),
        "devices": [
            d.to_schema()
            | {
                "wave_size": d.wave_size,
                "cuda_arch": d.cuda_arch,
                "vram_used_bytes": d.vram_used_bytes,
            }
            for d in facts.devices
        ],
        "checks": [c.to_dict() for c in checks],
        "summary": {s: counts[s] for s in STATUSES},
        "exit_code": code,
    }


def format_report(facts, checks: list[Check], code: int) -> str:
    width = max(len(c.name) for c in checks)
    lines = [
        f"rocmtrain doctor: backend={facts.backend} torch={'.'.join(map(str, platform.torch_version()))}"
        f" GPUs={len(facts.devices)} sources={','.join(facts.sources_used()) or 'none'}"
    ]
    for c in checks:
        lines.append(f"  {c.status.upper():5} {c.name:{width}}  {c.evidence}")
        if c.fix and c.status in ("warn", "error"):
            lines.append(f"  {'':5} {'':{width}}  fix: {c.fix}")
    counts = Counter(c.status for c in checks)
    lines.append("summary: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES) + f" -> exit {code}")
    return "\n".join(lines)


__all__ = ["PARSERS", "build_parser", "format_report", "main", "report_dict"]
