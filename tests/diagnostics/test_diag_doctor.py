"""Doctor checks fed with real files: recorded tool outputs, /proc-style files, env mappings.

The command runner returns the recorded output of the tool it is asked for (what `rocminfo` printed
on a 4x MI300X host), so every check runs its real parsing and decision path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from rocmtrain.diagnostics.checks import Inputs, run_checks
from rocmtrain.diagnostics.checks.base import GpuFacts
from rocmtrain.diagnostics.checks.gpu import check_memory_headroom
from rocmtrain.diagnostics.checks.versions import compat_checks
from rocmtrain.diagnostics.doctor import main as doctor_main
from rocmtrain.diagnostics.parsers import parse

REPO = Path(__file__).resolve().parents[2]


def _runner(fixtures_dir: Path, **files: str):
    outputs = {prog: (fixtures_dir / "rocm_smi" / f).read_text() for prog, f in files.items()}
    return lambda argv: outputs.get(argv[0])


def _proc(tmp_path: Path, *, numa: str = "0", cmdline: str = "ro quiet iommu=pt") -> Path:
    (tmp_path / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc/sys/kernel/numa_balancing").write_text(numa + "\n")
    (tmp_path / "proc/cmdline").write_text(cmdline + "\n")
    return tmp_path / "proc"


def _inputs(tmp_path: Path, fixtures_dir: Path, environ=None, **kw) -> Inputs:
    home, etc = tmp_path / "home", tmp_path / "etc"
    home.mkdir(exist_ok=True)
    etc.mkdir(exist_ok=True)
    run = _runner(
        fixtures_dir,
        rocminfo="mi300x_x4_rocminfo.txt",
        **{"rocm-smi": "mi300x_x4_rocm-smi_concise.txt"},
    )
    base = dict(
        environ=environ or {},
        proc=kw.pop("proc", None) or _proc(tmp_path),
        home=home,
        etc=etc,
        run=run,
        live=False,
    )
    base.update(kw)
    return Inputs(**base)


def _by_name(checks):
    return {c.name: c for c in checks}


def test_mi300x_node_all_clean(tmp_path: Path, fixtures_dir: Path) -> None:
    facts, checks = run_checks(_inputs(tmp_path, fixtures_dir))
    c = _by_name(checks)
    assert facts.backend == "rocm" and len(facts.devices) == 4
    assert c["gpu.visible"].status == "ok"
    assert "gfx942" in c["gpu.arch"].evidence and "0x74a1" in c["gpu.arch"].evidence
    assert c["gpu.wave_size"].status == "ok" and "wave64" in c["gpu.wave_size"].evidence
    assert c["node.numa_balancing"].status == "ok" and c["node.iommu"].status == "ok"
    assert c["env.HSA_OVERRIDE_GFX_VERSION"].status == "ok"
    # merged: temps/power from rocm-smi, VRAM from rocminfo
    assert facts.devices[3].temp_c == 38.0 and facts.devices[3].vram_total_bytes == 201310208 * 1024
    assert not [x for x in checks if x.status == "error"]


@pytest.mark.parametrize(
    "fixture", ["mi300x_x4_rocminfo.txt", "mi250x_lumi_rocminfo_agent_excerpt.txt"]
)
def test_hsa_override_on_instinct_is_error(
    tmp_path: Path, fixtures_dir: Path, fixture: str
) -> None:
    inputs = _inputs(tmp_path, fixtures_dir, environ={"HSA_OVERRIDE_GFX_VERSION": "9.4.2"})
    inputs.run = _runner(fixtures_dir, rocminfo=fixture)
    _, checks = run_checks(inputs)
    c = _by_name(checks)["env.HSA_OVERRIDE_GFX_VERSION"]
    assert c.status == "error" and "unset" in c.fix


def test_numa_iommu_and_rccl_conf(tmp_path: Path, fixtures_dir: Path) -> None:
    proc = _proc(tmp_path, numa="1", cmdline="BOOT_IMAGE=/vmlinuz ro amd_iommu=on")
    inputs = _inputs(tmp_path, fixtures_dir, proc=proc)
    (inputs.home / ".rccl.conf").write_text("NCCL_DEBUG=INFO\n# comment\nNCCL_MIN_NCHANNELS=112\n")
    _, checks = run_checks(inputs)
    c = _by_name(checks)
    assert c["node.numa_balancing"].status == "warn" and "=1" in c["node.numa_balancing"].evidence
    assert c["node.iommu"].status == "warn" and "amd_iommu=on" in c["node.iommu"].evidence
    conf = c["rccl.conf_files"]
    assert conf.status == "warn" and "NCCL_MIN_NCHANNELS" in conf.evidence
    assert "NCCL_DEBUG" in conf.evidence and "comment" not in conf.evidence


def test_pytorch_rocm_arch(tmp_path: Path, fixtures_dir: Path) -> None:
    ok = _by_name(
        run_checks(_inputs(tmp_path, fixtures_dir, environ={"PYTORCH_ROCM_ARCH": "gfx90a;gfx942"}))[
            1
        ]
    )
    assert ok["env.PYTORCH_ROCM_ARCH"].status == "ok"
    bad = _by_name(
        run_checks(_inputs(tmp_path, fixtures_dir, environ={"PYTORCH_ROCM_ARCH": "gfx90a"}))[1]
    )
    assert bad["env.PYTORCH_ROCM_ARCH"].status == "warn"
    assert "gfx90a;gfx942" in bad["env.PYTORCH_ROCM_ARCH"].fix


def test_env_registry_names_the_real_knob(tmp_path: Path, fixtures_dir: Path) -> None:
    pytest.importorskip("rocmtrain.comms.registry")
    environ = {"RCCL_PROTO": "LL", "NCCL_LL_THRESHOLD": "0", "NCCL_DEBUG": "INFO"}
    c = _by_name(run_checks(_inputs(tmp_path, fixtures_dir, environ=environ))[1])["env.registry"]
    assert c.status == "warn"
    assert "RCCL_PROTO → NCCL_PROTO" in c.fix and "NCCL_LL_THRESHOLD" in c.evidence
    assert "NCCL_DEBUG" not in c.evidence  # a real knob is not reported


def test_slurm_sanity(tmp_path: Path, fixtures_dir: Path) -> None:
    base = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "16", "SLURM_PROCID": "3", "SLURM_LOCALID": "3"}

    def status(env):
        return _by_name(run_checks(_inputs(tmp_path, fixtures_dir, environ=env))[1])[
            "cluster.slurm"
        ]

    assert status({}).status == "skip"
    assert status({"SLURM_JOB_ID": "42"}).status == "warn"  # salloc without srun
    assert status(base | {"SLURM_NTASKS_PER_NODE": "8", "SLURM_GPUS_ON_NODE": "8"}).status == "ok"
    over = status(base | {"SLURM_TASKS_PER_NODE": "16(x1)", "SLURM_GPUS_ON_NODE": "8"})
    assert over.status == "error" and "one process per GPU" in over.fix
    vis = _by_name(
        run_checks(
            _inputs(
                tmp_path,
                fixtures_dir,
                environ={"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "1"},
            )
        )[1]
    )["cluster.visible_devices"]
    assert vis.status == "warn"


@pytest.mark.parametrize(
    ("environ", "status"),
    [
        ({"HIP_VISIBLE_DEVICES": ""}, "ok"),  # HIP ignores it: falls back to CUDA_VISIBLE_DEVICES
        ({"CUDA_VISIBLE_DEVICES": ""}, "ok"),  # HIP applies no filter for an empty list
        ({"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": ""}, "ok"),
        ({"ROCR_VISIBLE_DEVICES": ""}, "warn"),  # ROCr then exposes no GPU
        ({"ROCR_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "0"}, "warn"),
    ],
)
def test_empty_visible_devices_on_rocm(
    tmp_path: Path, fixtures_dir: Path, environ: dict, status: str
) -> None:
    """On the recorded MI300X node only an empty ROCR_VISIBLE_DEVICES hides the GPUs."""
    facts, checks = run_checks(_inputs(tmp_path, fixtures_dir, environ=environ))
    assert facts.amd
    c = _by_name(checks)["cluster.visible_devices"]
    assert c.status == status, c
    assert ("hides every GPU" in c.fix) == (status == "warn")
    if status == "ok":
        assert "no GPU is hidden" in c.evidence


def test_empty_cuda_visible_devices_on_nvidia_hides_gpus(tmp_path: Path) -> None:
    from rocmtrain.diagnostics.checks.system import check_visible_devices

    nvidia = GpuFacts("cuda", [], [], None, {}, [])
    c = check_visible_devices(nvidia, Inputs(environ={"CUDA_VISIBLE_DEVICES": ""}))
    assert c.status == "warn" and "empty CUDA_VISIBLE_DEVICES hides every GPU" in c.fix


def test_memory_headroom(tmp_path: Path, fixtures_dir: Path) -> None:
    devs = parse("rocminfo", (fixtures_dir / "rocm_smi/mi300x_x4_rocminfo.txt").read_text()).devices
    total = devs[0].vram_total_bytes
    devs[0].vram_used_bytes = int(total * 0.95)
    devs[1].vram_used_bytes = int(total * 0.50)
    facts = GpuFacts("rocm", [], [], None, {"rocminfo": devs}, devs)
    c = check_memory_headroom(facts, Inputs(headroom_fraction=0.10))
    assert c.status == "warn" and "GPU(s) [0]" in c.evidence and "5% free" in c.evidence
    assert check_memory_headroom(facts, Inputs(headroom_fraction=0.04)).status == "ok"


def test_live_torch_blind_to_gpus_is_error(tmp_path: Path, fixtures_dir: Path) -> None:
    """This CPU torch on a node whose rocminfo lists 4 MI300X: the classic wrong-wheel install."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a torch that sees no GPU")
    inputs = _inputs(tmp_path, fixtures_dir, live=True)
    c = _by_name(run_checks(inputs)[1])["gpu.visible"]
    assert c.status == "error" and "torch sees 0 GPUs" in c.evidence and "4" in c.evidence


def test_compat_table_rows_from_rocm_facts() -> None:
    def st(*a, **k):
        return {c.name: c.status for c in compat_checks(*a, **k)}

    good = st(
        (2, 13, 0),
        hip_v=(7, 2, 1),
        fbgemm=("fbgemm-gpu", "1.8.0"),
        torchrec="1.8.0",
        archs=["gfx942"],
    )
    assert good == {
        "versions.torch_rocm": "ok",
        "versions.fbgemm_gpu": "ok",
        "versions.torchrec": "ok",
    }
    r = st(
        (2, 11, 0), hip_v=(7, 2), fbgemm=("fbgemm-gpu", "1.6.0"), torchrec="1.6.1", archs=["gfx90a"]
    )
    assert r["versions.torch_rocm"] == "ok" and r["versions.torchrec"] == "ok"
    # FBGEMM's docs say 1.6 is for ROCm 7.0/7.1, its release pipeline built 7.1/7.2: not warned on
    assert r["versions.fbgemm_gpu"] == "ok"
    r = st(
        (2, 10, 0), hip_v=(7, 2), fbgemm=("fbgemm-gpu", "1.5.0"), torchrec="1.5.0", archs=["gfx90a"]
    )
    assert r["versions.fbgemm_gpu"] == "warn"  # 1.5 is published for ROCm 7.0/7.1 only
    r = st((2, 13, 0), hip_v=(7, 1), fbgemm=("fbgemm-gpu", "1.6.0"), torchrec="1.8.0", archs=[])
    assert set(r.values()) == {"warn"}
    r = st((2, 6, 0), hip_v=(6, 2, 4), fbgemm=None, torchrec=None, archs=[])
    assert r == {
        "versions.torch_rocm": "ok",
        "versions.fbgemm_gpu": "warn",
        "versions.torchrec": "warn",
    }


def _cli(*args: str, env_extra=None) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ) | (env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "rocmtrain", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )


@pytest.mark.slow  # a real `python -m rocmtrain` process (imports torch + lightning)
def test_doctor_cli_json_on_this_machine() -> None:
    p = _cli("doctor", "--json")
    data = json.loads(p.stdout)
    assert p.returncode == (1 if data["summary"]["error"] else 0)
    names = {c["name"]: c for c in data["checks"]}
    assert metadata.version("torchrec") in names["versions.torchrec"]["evidence"]
    assert set(data["summary"]) == {"ok", "warn", "error", "skip"}
    assert all(c["status"] in data["summary"] for c in data["checks"])


def test_doctor_offline_error_exit(fixtures_dir: Path, capsys, monkeypatch) -> None:
    f = fixtures_dir / "rocm_smi" / "mi300x_x4_rocminfo.txt"
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "9.4.2")
    assert doctor_main(["--tool-output", f"rocminfo={f}"]) == 1
    assert "ERROR env.HSA_OVERRIDE_GFX_VERSION" in capsys.readouterr().out
    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION")
    assert doctor_main(["--tool-output", f"rocminfo={f}", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backend"] == "rocm" and len(data["devices"]) == 4
    assert data["devices"][0]["wave_size"] == 64 and data["exit_code"] == 0
    assert doctor_main(["--tool-output", "rocmsmi=x"]) == 2
    assert "KIND=FILE" in capsys.readouterr().err


def test_doctor_parse_cli_every_fixture(fixtures_dir: Path, tmp_path: Path, capsys) -> None:
    kinds = ("rocminfo", "rocm-smi", "amd-smi")
    keys = [
        "index",
        "gfx_arch",
        "device_id",
        "name",
        "vram_total_bytes",
        "power_w",
        "temp_c",
        "util_pct",
    ]
    for f in sorted((fixtures_dir / "rocm_smi").iterdir()):
        kind = next(k for k in kinds if f"_{k}" in f.name)
        assert doctor_main(["parse", kind, str(f), "--json"]) == 0, f.name
        data = json.loads(capsys.readouterr().out)
        assert set(data) == {"devices", "warnings"} and data["devices"]
        assert all(list(d) == keys for d in data["devices"])
    hip = fixtures_dir / "hipify/hipify-perl_examine_nbody.txt"
    assert doctor_main(["parse", "hipify-stats", str(hip), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in data.items() if k != "files"} == {
        "converted": 7,
        "warnings": 0,
        "loc": 91,
    }
    assert (
        doctor_main(
            ["parse", "rocm-smi", str(fixtures_dir / "rocm_smi/mi250_rocm-smi_showpower.txt")]
        )
        == 0
    )
    assert "power_w=237.0" in capsys.readouterr().out


@pytest.mark.slow  # a real process: checks exit code and that no traceback escapes
def test_doctor_parse_bad_input_is_clear(tmp_path: Path) -> None:
    junk = tmp_path / "junk.txt"
    junk.write_text("hello world\nthis is not a tool output\n")
    p = _cli("doctor", "parse", "rocm-smi", str(junk), "--json")
    assert p.returncode == 1 and "not rocm-smi output" in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""


def test_doctor_parse_missing_file(tmp_path: Path, capsys) -> None:
    assert doctor_main(["parse", "rocminfo", str(tmp_path / "missing.txt")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["hello world\n", ""])
def test_doctor_unreadable_tool_output_is_a_usage_error(tmp_path: Path, capsys, content) -> None:
    """A saved output that does not parse ends the doctor (exit 2, one line naming the file),
    instead of silently checking the live host and passing."""
    f = tmp_path / "rocminfo.txt"
    f.write_text(content)
    assert doctor_main(["--tool-output", f"rocminfo={f}"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"rocmtrain doctor: --tool-output rocminfo={f}: "
    )
    assert captured.out == ""


@pytest.mark.parametrize(
    ("environ", "name", "status", "needle"),
    [
        ({"HIP_VISIBLE_DEVICES": "abc"}, "cluster.visible_devices", "error", "GPU indices"),
        ({"CUDA_VISIBLE_DEVICES": "0,x"}, "cluster.visible_devices", "error", "UUIDs"),
        ({"ROCR_VISIBLE_DEVICES": "0, 1"}, "cluster.visible_devices", "ok", ""),
        ({"CUDA_VISIBLE_DEVICES": "GPU-8a3e-11"}, "cluster.visible_devices", "ok", ""),
        ({"NCCL_SOCKET_IFNAME": "nosuchif0"}, "env.NCCL_SOCKET_IFNAME", "error", "ip -br link"),
        ({"NCCL_SOCKET_IFNAME": "lo"}, "env.NCCL_SOCKET_IFNAME", "ok", ""),
        ({"NCCL_SOCKET_IFNAME": "=l"}, "env.NCCL_SOCKET_IFNAME", "error", "exact =eth0"),
        ({"NCCL_DEBUG": "garbage"}, "env.NCCL_DEBUG", "warn", "INFO"),
        ({"NCCL_DEBUG": "info"}, "env.NCCL_DEBUG", "ok", ""),
    ],
)
def test_collective_env_values_are_checked(
    tmp_path: Path, fixtures_dir: Path, environ, name, status, needle
) -> None:
    """Values the runtimes read without complaint but that hide GPUs, select no network
    interface (this node's real interfaces: it has ``lo``) or set no debug level."""
    c = _by_name(run_checks(_inputs(tmp_path, fixtures_dir, environ=environ))[1])[name]
    assert c.status == status and needle in c.fix, c
