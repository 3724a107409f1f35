"""``python -m rocmtrain``: subcommands first, then the Hydra training entry point.

python -m rocmtrain                          # CPU recipe: small DLRM, 2 gloo ranks
python -m rocmtrain recipe=dlrm_mi300 ...    # any recipe with Hydra overrides
python -m rocmtrain doctor [--json]          # environment checks
python -m rocmtrain scan PATH...             # CUDA→HIP porting traps
python -m rocmtrain rccl-tests parse|sweep   # rccl-tests / nccl-tests wrapper
python -m rocmtrain precision-matrix ...     # per-op error vs fp64 on this platform
"""

from __future__ import annotations

import importlib
import sys

#: subcommand → "module:function"; each function takes argv (list[str]) and returns an exit code.
SUBCOMMANDS: dict[str, str] = {
    "doctor": "rocmtrain.diagnostics.doctor:main",
    "scan": "rocmtrain.diagnostics.scan:main",
    "rccl-tests": "rocmtrain.comms.rccl_tests.cli:main",
    "precision-matrix": "rocmtrain.precision.matrix:main",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        module, func = SUBCOMMANDS[argv[0]].split(":")
        try:
            entry = getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError):
            print(f"rocmtrain {argv[0]}: not implemented yet", file=sys.stderr)
            return 2
        return int(entry(argv[1:]) or 0)
    from rocmtrain.cli import hydra_main  # Hydra only for training runs

    return hydra_main(argv)


if __name__ == "__main__":
    sys.exit(main())
