"""Every core dependency in pyproject.toml is used: imported by rocmtrain, or a runtime
dependency of torchrec (which is installed ``--no-deps``, so we must name its needs)."""

from __future__ import annotations

import ast
import re
from importlib.metadata import requires
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
#: distribution name -> import name, where they differ
IMPORT_NAMES = {"pytorch-lightning": "pytorch_lightning", "hydra-core": "hydra"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


def _imported_modules() -> set[str]:
    found: set[str] = set()
    for path in (REPO / "rocmtrain").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return found


def test_every_core_dependency_is_imported_or_needed_by_torchrec():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    torchrec_needs = {_name(r) for r in requires("torchrec") or [] if "extra ==" not in r}
    imported = _imported_modules()
    unused = [
        d
        for d in map(_name, deps)
        if IMPORT_NAMES.get(d, d.replace("-", "_")) not in imported and d not in torchrec_needs
    ]
    assert not unused, f"dependencies nothing imports: {unused}"
