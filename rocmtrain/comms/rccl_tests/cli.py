"""``python -m rocmtrain rccl-tests {parse,run,sweep}``: judge, run and sweep rccl-tests / nccl-tests.

    python -m rocmtrain rccl-tests parse all_reduce.log [--json] [--min-busbw 150 --floor-min-bytes 64M]
    python -m rocmtrain rccl-tests run all_reduce --ngpus 8 --max-bytes 256M [--tests-dir DIR]
    python -m rocmtrain rccl-tests sweep --collectives all_reduce,alltoall --protocols unset,LL,Simple \\
        --algorithms unset,Ring,Tree --ngpus 8 --out runs/sweep --preset-name mi300x_measured

Exit codes: 0 = a complete, healthy run (sweep: every run completed); 1 = the run failed, hung, was
truncated or is unhealthy (the reasons are printed); 2 = bad usage (missing file/binary, bad option).
``parse --json`` prints one object: ``{"ok", "collective", "ranks", "rows": [{"size_bytes", "count",
"type", "redop", "root", "out_of_place": {"time_us", "algbw_gbps", "busbw_gbps", "wrong"} | null,
"in_place": ... | null}], "avg_busbw_gbps", "errors": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from rocmtrain import exit_codes
from rocmtrain.comms import registry
from rocmtrain.comms.rccl_tests import parser as p
from rocmtrain.comms.rccl_tests import runner, sweep


class _Usage(Exception):
    """Bad input from the user: print and exit USAGE."""


def _size(text: str) -> int:
    try:
        return runner.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise _Usage(f"--env {pair!r}: expected NAME=VALUE")
        if registry.is_forbidden(name):
            raise _Usage(f"--env {name}: {registry.describe(registry.ENV_VARS[name])}")
        out[name] = value
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m rocmtrain rccl-tests", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="cmd", required=True)
    health = argparse.ArgumentParser(add_help=False)
    health.add_argument("--min-busbw", type=float, default=None, metavar="GBPS",
                        help="expected busbw floor per size (GB/s)")  # fmt: skip
    health.add_argument(
        "--floor-min-bytes",
        type=_size,
        default=0,
        metavar="SIZE",
        help="apply the floor only to sizes >= SIZE (small sizes are latency bound)",
    )
    a = sub.add_parser("parse", parents=[health], help="parse and judge a log (text, .json, .csv)")
    a.add_argument("logfile", help="log file, or - for stdin")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.add_argument("--format", choices=("auto", "text", "json", "csv"), default="auto")
    a.add_argument("--collective", default=None, help="name it when the log does not")
    run_opts = argparse.ArgumentParser(add_help=False)
    run_opts.add_argument(
        "--tests-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="directory with the *_perf binaries (also $RCCL_TESTS_DIR, PATH)",
    )
    run_opts.add_argument("--min-bytes", type=_size, default=8)
    run_opts.add_argument("--max-bytes", type=_size, default=128 << 20)
    run_opts.add_argument("--step-factor", type=int, default=2)
    run_opts.add_argument("--iters", type=int, default=20)
    run_opts.add_argument("--warmup-iters", type=int, default=5)
    run_opts.add_argument("--ngpus", type=int, default=1, help="-g: GPUs per process")
    run_opts.add_argument("--check", type=int, default=1, help="-c: validate results (0 = off)")
    run_opts.add_argument("--launcher", choices=("local", "srun", "mpirun"), default="local")
    run_opts.add_argument("--nprocs", type=int, default=1, help="processes (srun/mpirun)")
    run_opts.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="outer timeout per run (s): the process group is killed",
    )
    run_opts.add_argument(
        "--binary-timeout",
        type=int,
        default=0,
        help="the binary's own -T timeout (s); 0 = not passed",
    )
    run_opts.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra env for the runs (validated against the registry)",
    )
    r = sub.add_parser("run", parents=[run_opts, health], help="run one collective and judge it")
    r.add_argument("collective", choices=runner.SUPPORTED)
    r.add_argument("--log", type=Path, default=None, help="save the raw output here")
    r.add_argument("--json", action="store_true")
    r.add_argument(
        "--output-file",
        type=Path,
        default=None,
        help="also ask the binary for its JSON (nccl-tests) / CSV (rccl-tests) file",
    )
    s = sub.add_parser("sweep", parents=[run_opts], help="protocol × algorithm × channels sweep")
    s.add_argument("--collectives", default="all_reduce,alltoall")
    s.add_argument("--protocols", default="unset,LL,LL128,Simple")
    s.add_argument("--algorithms", default="unset,Ring,Tree")
    s.add_argument("--channels", default="unset")
    s.add_argument("--out", type=Path, required=True, help="output directory")
    s.add_argument("--preset-name", default="measured")
    s.add_argument(
        "--score-min-bytes",
        type=_size,
        default=0,
        help="score settings on sizes >= SIZE (the sizes your workload sends)",
    )
    s.add_argument(
        "--metric",
        choices=tuple(sweep.METRICS),
        default="busbw",
        help="compare busbw (default), algbw or time (on a single GPU busbw is 0: use time)",
    )
    s.add_argument(
        "--margin",
        type=float,
        default=0.03,
        help="a setting must beat unset by this fraction to be chosen",
    )
    return ap


def _print_table(res: p.ParseResult) -> None:
    print(f"collective: {res.collective or '?'}  ranks: {res.ranks or '?'}  rows: {len(res.rows)}")
    head = f"{'size(B)':>12} {'count':>11} {'type':>8} {'redop':>6} {'root':>5}"
    blk = f" {'time_us':>9} {'algbw':>7} {'busbw':>7} {'wrong':>6}"
    print(head + blk + " |" + blk)

    def cell(m: p.Measurement | None) -> str:
        if m is None:
            return f" {'-':>9} {'-':>7} {'-':>7} {'-':>6}"
        w = "N/A" if m.wrong is None else str(m.wrong)
        if m.max_error is not None:
            w = f"{m.max_error:.0e}"
        return f" {m.time_us:>9.2f} {m.algbw_gbps:>7.2f} {m.busbw_gbps:>7.2f} {w:>6}"

    for row in res.rows:
        lead = f"{row.size_bytes:>12} {row.count:>11} {row.type:>8} {row.redop or '-':>6} "
        print(lead + f"{'-' if row.root is None else row.root:>5}" + cell(row.out_of_place) + " |"
              + cell(row.in_place))  # fmt: skip
    if res.avg_busbw_gbps is not None:
        print(f"avg bus bandwidth (as printed, averages every row): {res.avg_busbw_gbps:g} GB/s")


def _report(res: p.ParseResult, errors: list[str], warnings: list[str], *, as_json: bool) -> int:
    if as_json:
        print(json.dumps(p.to_json(res, errors), indent=1))
    else:
        _print_table(res)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if errors:
        print("FAILED:\n" + "\n".join(f"  - {e}" for e in errors), file=sys.stderr)
        return exit_codes.FAILURE
    if not as_json:
        print(f"OK: complete healthy run ({len(res.rows)} sizes)")
    return exit_codes.OK


def _cmd_parse(args: argparse.Namespace) -> int:
    try:
        if args.logfile == "-":
            text = sys.stdin.read()
        else:
            text = Path(args.logfile).read_text(errors="replace")
    except OSError as exc:
        raise _Usage(f"cannot read {args.logfile!r}: {exc.strerror or exc}") from None
    fmt = args.format
    if fmt == "auto":
        suffix = Path(args.logfile).suffix.lower()
        fmt = {".json": "json", ".csv": "csv"}.get(suffix, "text")
    try:
        res = {"text": p.parse_text, "json": p.parse_json, "csv": p.parse_csv}[fmt](text)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        res = p.ParseResult(parse_errors=[f"cannot parse {args.logfile} as {fmt}: {exc}"])
    if args.collective:
        res.collective = args.collective
    errors, warnings = p.assess(res, min_busbw_gbps=args.min_busbw,
                                floor_min_bytes=args.floor_min_bytes)  # fmt: skip
    return _report(res, errors, warnings, as_json=args.json)


def _spec(args: argparse.Namespace) -> runner.RunSpec:
    return runner.RunSpec(min_bytes=args.min_bytes, max_bytes=args.max_bytes,
                           step_factor=args.step_factor, iters=args.iters,
                           warmup_iters=args.warmup_iters, gpus_per_proc=args.ngpus,
                           check=args.check, binary_timeout_s=args.binary_timeout)  # fmt: skip


def _cmd_run(args: argparse.Namespace) -> int:
    env = {**os.environ, **_env_pairs(args.env)}
    try:
        binary = runner.find_binary(args.collective, search_dirs=args.tests_dir, environ=env)
        spec = _spec(args)
        if args.output_file is not None:
            spec.output_format = runner.output_support(binary)  # type: ignore[assignment]
            if spec.output_format is None:
                print(f"warning: {binary.name} -h advertises no JSON/CSV output; text only",
                      file=sys.stderr)  # fmt: skip
            else:
                spec.output_file = str(args.output_file)
        cmd = runner.build_command(binary, spec, launcher=args.launcher, nprocs=args.nprocs)
    except (FileNotFoundError, ValueError) as exc:
        raise _Usage(str(exc)) from None
    print("running: " + shlex.join(cmd), file=sys.stderr)
    out = runner.run_test(
        cmd,
        timeout_s=args.timeout,
        env=env,
        log_path=args.log,
        min_busbw_gbps=args.min_busbw,
        floor_min_bytes=args.floor_min_bytes,
    )
    if spec.output_file and spec.output_format:
        other = runner.read_output_file(spec.output_file, spec.output_format)
        sizes = lambda res: [r.size_bytes for r in res.rows]  # noqa: E731
        if other.parse_errors or sizes(other) != sizes(out.parsed):
            out.warnings.append(f"{spec.output_format} file {spec.output_file} disagrees with the "
                                f"text output: {other.parse_errors or 'different sizes'}")  # fmt: skip
        else:
            print(f"{spec.output_format} output: {spec.output_file} ({len(other.rows)} rows, "
                  "matches the text)", file=sys.stderr)  # fmt: skip
    return _report(out.parsed, out.errors, out.warnings, as_json=args.json)


def _cmd_sweep(args: argparse.Namespace) -> int:
    split = lambda s: [x for x in s.split(",") if x.strip()]  # noqa: E731
    colls = split(args.collectives)
    bad = [c for c in colls if c not in runner.SUPPORTED]
    if bad or not colls:
        raise _Usage(
            f"--collectives {args.collectives!r}: choose from {', '.join(runner.SUPPORTED)}"
        )
    try:
        settings = sweep.grid(split(args.protocols), split(args.algorithms), split(args.channels))
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    if sweep.Setting() not in settings:  # the baseline every score is relative to
        settings.insert(0, sweep.Setting())
    base = {**os.environ, **_env_pairs(args.env)}
    command = shlex.join(["python", "-m", "rocmtrain", "rccl-tests", *args.argv])
    try:
        runs = sweep.run_sweep(collectives=colls, settings=settings, spec=_spec(args),
                               out_dir=args.out, search_dirs=args.tests_dir,
                               launcher=args.launcher, nprocs=args.nprocs, timeout_s=args.timeout,
                               base_env=base)  # fmt: skip
    except (FileNotFoundError, ValueError) as exc:
        raise _Usage(str(exc)) from None
    paths = sweep.write_outputs(
        runs,
        args.out,
        preset_name=args.preset_name,
        command=command,
        score_min_bytes=args.score_min_bytes,
        margin=args.margin,
        metric=args.metric,
    )
    print(paths["table"].read_text())
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    failed = [r for r in runs if not r.ok]
    if failed:
        print(f"FAILED: {len(failed)} of {len(runs)} runs failed (see the table)", file=sys.stderr)
        return exit_codes.FAILURE
    return exit_codes.OK


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = ap.parse_args(argv)
        args.argv = argv
    except SystemExit as exc:  # argparse already printed the message
        return exit_codes.USAGE if exc.code else exit_codes.OK
    try:
        return {"parse": _cmd_parse, "run": _cmd_run, "sweep": _cmd_sweep}[args.cmd](args)
    except _Usage as exc:
        print(f"rccl-tests {args.cmd}: error: {exc}", file=sys.stderr)
        return exit_codes.USAGE


if __name__ == "__main__":
    sys.exit(main())
