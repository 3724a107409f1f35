"""The profiler wrapper script and the vendor-library readers on a machine without a GPU driver."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from rocmtrain.diagnostics import sources
from rocmtrain.diagnostics.device_sampler import NvmlSampler, make_sampler

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts/profile/profile_recipe.sh"


def _run(*args: str, path: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=path)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_profile_script_without_profiler(tmp_path: Path) -> None:
    p = _run("--", "recipe=dlrm_cpu", path="/usr/bin:/bin")
    assert p.returncode == 2
    assert "no GPU profiler on PATH" in p.stderr and "profile=true" in p.stderr


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        (
            "rocprofv3",
            ["rocprofv3", "--kernel-trace", "--stats", "-d", "OUT", "--", "-m", "rocmtrain"],
        ),
        ("rocprof", ["rocprof", "--stats", "--hip-trace", "OUT/results.csv", "-m", "rocmtrain"]),
        ("nsys", ["nsys", "profile", "--stats=true", "OUT/rocmtrain", "-m", "rocmtrain"]),
    ],
)
def test_profile_script_commands(tmp_path: Path, tool: str, expected: list[str]) -> None:
    out = tmp_path / "prof"
    p = _run(
        "--tool",
        tool,
        "--out",
        str(out),
        "--dry-run",
        "--",
        "recipe=dlrm_mi300",
        path="/usr/bin:/bin",
    )
    assert p.returncode == 0, p.stderr
    words = p.stdout.replace(str(out), "OUT").split()
    assert all(w in words for w in expected), words
    assert words[-1] == "recipe=dlrm_mi300"
    assert not out.exists()  # dry run writes nothing


def test_profile_script_picks_tool_from_path(tmp_path: Path) -> None:
    """With an `nsys` executable first on PATH the script runs it with the recipe command."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "nsys"  # records its argv, like a profiler that exits immediately
    fake.write_text('#!/bin/sh\necho "$@" > "$NSYS_ARGS_FILE"\n')
    fake.chmod(0o755)
    args_file = tmp_path / "args.txt"
    env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin", NSYS_ARGS_FILE=str(args_file))
    out = tmp_path / "prof"
    p = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(out), "--", "trainer.max_steps=5"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert args_file.read_text().split()[:2] == ["profile", "-t"]
    assert (out / "COMMAND").read_text().startswith("nsys profile")


def test_nvml_without_driver() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pytest.skip("an NVIDIA driver is present")
    except pynvml.NVMLError:
        pass
    assert sources.nvml_devices() == []
    with pytest.raises(pynvml.NVMLError):
        NvmlSampler()


def test_no_sampler_and_no_cli_on_cpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("GPU machine")
    assert make_sampler() is None
    assert sources.run_command(["rocmtrain-no-such-tool"]) is None
    assert sources.amdsmi_devices() == []  # amdsmi absent or no AMD GPU: nothing, no exception


def test_nvml_api_names_exist() -> None:
    """Every NVML call the doctor and the sampler make exists in the installed nvidia-ml-py."""
    pynvml = pytest.importorskip("pynvml")
    import inspect

    from rocmtrain.diagnostics import device_sampler

    src = inspect.getsource(sources) + inspect.getsource(device_sampler)
    used = set(re.findall(r"\b(?:pynvml|nv)\.(nvml\w+|NVML_\w+)", src))
    assert len(used) >= 10
    assert [n for n in sorted(used) if not hasattr(pynvml, n)] == []


def test_amdsmi_api_names_exist() -> None:
    """Every amdsmi call we make exists in the installed amdsmi package (read as source: importing it
    needs libamd_smi.so, which only ROCm machines have)."""
    import importlib.util
    import inspect

    from rocmtrain.diagnostics import device_sampler

    spec = importlib.util.find_spec("amdsmi")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("amdsmi package not installed")
    iface = Path(next(iter(spec.submodule_search_locations))) / "amdsmi_interface.py"
    lib = iface.read_text()
    src = inspect.getsource(sources) + inspect.getsource(device_sampler)
    calls = set(re.findall(r"\b(?:amdsmi|_lib)\.(amdsmi_\w+)", src))
    assert len(calls) >= 8
    assert [c for c in sorted(calls) if f"def {c}(" not in lib] == []
    for enum, member in re.findall(r"(AmdSmiTemperature(?:Type|Metric))\.(\w+)", src):
        assert re.search(rf"class {enum}\(IntEnum\):(?:\n    .*)*\n    {member} =", lib)


def test_amdsmi_without_library_is_harmless() -> None:
    """The amdsmi package without libamd_smi.so raises KeyError on import: no devices, no crash."""
    import importlib.util

    if importlib.util.find_spec("amdsmi") is None:
        pytest.skip("amdsmi package not installed")
    if Path("/opt/rocm/lib/libamd_smi.so").exists():
        pytest.skip("ROCm machine: libamd_smi.so present")
    assert sources.amdsmi_devices() == []
