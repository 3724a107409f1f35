"""The container images get exactly these Python packages: torch, fbgemm-gpu and torchrec
(``--no-deps``) from ``Dockerfile.rocm``, then ``scripts/container/requirements.txt``. This test
runs the image's Python imports in a fresh interpreter of this machine's environment that may import
only modules whose distribution is one of those, or a dependency pip would install with them.

No pip install here: a meta-path finder refuses every module of another installed distribution, so
an import that works in the test works with the listed packages (optional imports behave as they
would in the image: they fall back). The control run proves the finder bites: torchrec's Criteo
converter (``BinaryCriteoUtils.tsv_to_npys``, what ``npy_preproc_criteo.py`` calls, which
rocmtrain's Criteo docs tell users to run) fails without ``iopath`` and works with it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
CONTAINER = REPO / "scripts" / "container"
#: CPU twins installed here for the image's GPU wheels (same import names)
CPU_TWIN = {"fbgemm-gpu": "fbgemm-gpu-cpu"}
#: installed --no-deps in the image: its own metadata requirements are not pulled in
NO_DEPS = {"torchrec"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _listed() -> set[str]:
    """Distributions the image installs: the Dockerfile's pinned wheels + requirements.txt."""
    names = set(re.findall(r'"([\w.-]+)==\$\{', (CONTAINER / "Dockerfile.rocm").read_text()))
    for line in (CONTAINER / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.add(Requirement(line).name)
    return {_norm(CPU_TWIN.get(_norm(n), n)) for n in names}


def _closure(roots: set[str]) -> set[str]:
    """``roots`` and what pip installs with them (their unconditional requirements, recursively)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in NO_DEPS:
            continue
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # listed but not installed here: the import run will show what is missing
        for text in reqs:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_norm(req.name))
    return seen


# Runs in a fresh interpreter: argv[1] = JSON list of allowed distributions.
_SCRIPT = r"""
import importlib.abc, importlib.metadata as md, json, re, sys, tempfile
allowed = set(json.loads(sys.argv[1]))
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
providers = {m: {norm(d) for d in ds} for m, ds in md.packages_distributions().items()}
refused = []

class OnlyListed(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        dists = providers.get(top)
        if top in sys.stdlib_module_names or not dists or dists & allowed:
            return None  # let the normal finders handle it
        refused.append(top)
        raise ModuleNotFoundError(f"No module named {top!r} (not in the image)", name=top)

sys.meta_path.insert(0, OnlyListed())
import torchrec.datasets.utils  # noqa: F401
from torchrec.datasets.criteo import BinaryCriteoUtils

def convert(tsv, out):
    BinaryCriteoUtils.tsv_to_npys(tsv, out + "_d.npy", out + "_s.npy", out + "_l.npy")

out = tempfile.mkdtemp()
allowed_io = "iopath" in allowed
allowed.discard("iopath")
try:
    convert(sys.argv[2], out + "/a")
    control = "converted without iopath"
except ImportError as e:
    control = "ImportError: " + str(e)
if allowed_io:
    allowed.add("iopath")
convert(sys.argv[2], out + "/b")
print(json.dumps({"control": control, "refused": sorted(set(refused))}))
"""


def test_listed_packages_are_enough_for_torchrec_datasets(data_dir: Path) -> None:
    listed = _listed()
    assert {"torch", "fbgemm-gpu-cpu", "torchrec"} <= listed  # the Dockerfile was parsed
    allowed = _closure(listed)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _SCRIPT,
            json.dumps(sorted(allowed)),
            str(data_dir / "sample_train.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # the finder bites: without iopath torchrec's Criteo converter cannot load the file
    assert result["control"].startswith("ImportError") and "iopath" in result["control"]
