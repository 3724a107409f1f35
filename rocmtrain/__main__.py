"""``python -m rocmtrain``: subcommands first, then the Hydra training entry point.

python -m rocmtrain                          # CPU recipe: small DLRM, 2 gloo ranks
python -m rocmtrain recipe=dlrm_mi300 ...    # any recipe with Hydra overrides
python -m rocmtrain doctor [--json]          # environment checks
python -m rocmtrain scan PATH...             # CUDA→HIP porting traps
python -m rocmtrain rccl-tests parse|sweep   # rccl-tests / nccl-tests wrapper
python -m rocmtrain precision-matrix ...     # per-op error vs fp64 on this platform
python -m rocmtrain write-data synthetic|expand ...  # Criteo-layout day files (multi-hot, one-hot)
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Callable

#: subcommand → "module:function"; each function takes argv (list[str]) and returns an exit code.
SUBCOMMANDS: dict[str, str] = {
    "doctor": "rocmtrain.diagnostics.doctor:main",
    "scan": "rocmtrain.diagnostics.scan:main",
    "rccl-tests": "rocmtrain.comms.rccl_tests.cli:main",
    "precision-matrix": "rocmtrain.precision.matrix:main",
    "write-data": "rocmtrain.data.multihot_writer:main",
}


#: what a shell reports for a tool that SIGPIPE ended (128 + signal number), as ``cat`` or ``grep``
PIPE_CLOSED = 128 + signal.SIGPIPE


def run_piped(entry: Callable[[list[str]], int | None], args: list[str]) -> int:
    """Run a subcommand whose reader may go away early (``... | head -1``): exit quietly.

    Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError, either in the
    command or in the interpreter's final flush of stdout (then as an "Exception ignored" line).
    Flushing here catches both; stdout is then pointed at /dev/null so that the interpreter's
    own flush at exit has nothing left to fail on.
    """
    try:
        code = int(entry(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return PIPE_CLOSED
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        module, func = SUBCOMMANDS[argv[0]].split(":")
        entry = getattr(importlib.import_module(module), func)
        return run_piped(entry, argv[1:])
    from rocmtrain.cli import hydra_main  # Hydra only for training runs

    return hydra_main(argv)


def _missing_stack(exc: ModuleNotFoundError) -> int:
    """The Python running this lacks the training stack: most often the project's .venv is not
    activated. One line that says so, instead of an import traceback."""
    print(
        f"rocmtrain: error: {exc.name or exc} is not installed for {sys.executable}; activate the "
        "environment (. .venv/bin/activate, made by bash scripts/setup.sh) or install it (README: "
        "Install)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    try:
        code = main()
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] == "rocmtrain":
            raise
        code = _missing_stack(exc)
    sys.exit(code)
