"""Dependency noise: a line a dependency logs in every process of a run is shown once.

Real processes: a parent that imports rocmtrain starts 14 children with multiprocessing's spawn
(as compile workers and loader processes are started); each child imports rocmtrain again and
then runs torch.fx's real ``is_fx_tracing()`` (which logs its hint once per process) and logs
FBGEMM's compat-table line through the root logger as ``fbgemm_gpu/__init__.py`` does. Without
the filter every process prints each line (the control, with fewer children); with it, once.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import logging, multiprocessing as mp, sys
    if sys.argv[1] == "quiet":
        import rocmtrain  # noqa: F401  (installs the filter, as every rocmtrain process does)

    FBGEMM = ("_fbgemm_torch_compat_table has no entry for 1.6.0 of FBGEMM; "
              "cannot determine compatibility with PyTorch 2.11.0")

    def noisy(_):
        from torch.fx._symbolic_trace import is_fx_tracing
        is_fx_tracing()
        logging.warning(FBGEMM)
        logging.warning("a warning nobody filters")

    if __name__ == "__main__":
        noisy(None)
        n = int(sys.argv[2])
        with mp.get_context("spawn").Pool(n) as pool:
            pool.map(noisy, range(n), chunksize=1)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "children"), [("quiet", 14), ("plain", 2)])
def test_a_dependency_line_from_fifteen_processes_is_shown_once(tmp_path, mode, children):
    script = tmp_path / "noisy.py"
    script.write_text(SCRIPT)
    res = subprocess.run(
        [sys.executable, str(script), mode, str(children)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    fx = res.stderr.count("is_fx_tracing will return true")
    fbgemm = res.stderr.count("_fbgemm_torch_compat_table has no entry")
    other = res.stderr.count("a warning nobody filters")
    if mode == "plain":  # the control: the noise is real, every process prints it
        assert (fx, fbgemm) == (children + 1, children + 1)
    else:
        assert (fx, fbgemm) == (1, 1)
    assert other == children + 1  # nothing else is filtered


def test_precision_hints_are_dropped_only_when_asked():
    import logging
    import warnings

    from rocmtrain.console import PRECISION_HINTS, quiet_precision_hints

    inductor = (
        "TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled. "
        "Consider setting `torch.set_float32_matmul_precision('high')` for better performance."
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn(inductor, UserWarning, stacklevel=1)
        quiet_precision_hints()
        warnings.warn(inductor, UserWarning, stacklevel=1)
    assert len(caught) == 1
    lightning = logging.getLogger("lightning_fabric.utilities.rank_zero")
    record = lightning.makeRecord(
        lightning.name, logging.INFO, __file__, 1,
        "You are using a CUDA device ('NVIDIA H200') that has Tensor Cores. To properly utilize "
        "them, you should set `torch.set_float32_matmul_precision('medium' | 'high')`", (), None,
    )  # fmt: skip
    assert not lightning.filter(record)
    assert PRECISION_HINTS  # both hints are listed with their source
