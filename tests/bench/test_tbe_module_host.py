"""tbe_module_host.py: host cost of the module's forward per source tree, in fresh interpreters."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_compares_source_trees_and_sees_a_slower_forward(tmp_path):
    """A copy of rocmtrain whose module forward sleeps 0.5 ms more per call reads slower than the
    repository's own tree by about that much; each tree is imported from its own path."""
    slow = tmp_path / "slow"
    shutil.copytree(ROOT / "rocmtrain", slow / "rocmtrain")
    tbe = slow / "rocmtrain/kernels/tbe.py"
    src = tbe.read_text()
    hook = "        self._check_args(indices, offsets, per_sample_weights)\n"
    assert hook in src
    tbe.write_text(src.replace(hook, "        __import__('time').sleep(5e-4)\n" + hook))
    out = tmp_path / "host.json"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts/bench/tbe_module_host.py"), "--src", str(ROOT),
         "--src", str(slow), "--rounds", "2", "--readings", "1", "--calls", "100",
         "--out", str(out)], check=True,
    )  # fmt: skip
    res = json.loads(out.read_text())
    fast, slowed = res[str(ROOT)], res[str(slow)]
    assert len(fast["us"]) == len(slowed["us"]) == 2
    assert slowed["median"] - fast["median"] > 400  # the added 500 us per call, timer slack
    assert fast["baseline_over_this"] == [1.0, 1.0, 1.0]
    assert slowed["baseline_over_this"][2] < 0.5  # baseline / slowed, every round
