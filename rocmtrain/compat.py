"""The version pairing of the stack, in one place: torch ↔ ROCm ↔ fbgemm-gpu ↔ torchrec.

Pure data and small lookups. The doctor's version check
(``rocmtrain.diagnostics.checks.versions``), the container files (``scripts/container/``) and
the README's Install commands all follow this module; ``tests/launch/test_containers.py`` fails
when a Dockerfile or the README pins something else.

    from rocmtrain import compat
    compat.PINNED.torch                 # '2.13.0'
    compat.stable_rocm((2, 11))         # (7, 2)
    compat.fbgemm_for_torch((2, 13))    # (1, 8)
    compat.fbgemm_rocm((1, 3))          # FbgemmRocm(rocm=((6, 3), (6, 4)), ..., verified=True)

Every row names where it comes from (:data:`SOURCES`). A row no published matrix backs is kept
with ``verified=False``; the doctor does not warn on such a row.
"""

from __future__ import annotations

from dataclasses import dataclass

MM = tuple[int, int]

#: where the rows below come from (cited by key)
SOURCES: dict[str, str] = {
    "torch-release": "pytorch/pytorch RELEASE.md, 'Release Compatibility Matrix' (Stable ROCm)",
    "fbgemm-releases": (
        "pytorch/FBGEMM fbgemm_gpu/docs/src/general/Releases.rst 'FBGEMM Releases "
        "Compatibility Table' (docs.pytorch.org/FBGEMM/general/Releases.html): rows 0.4.0-1.6.0"
    ),
    "fbgemm-1.6": (
        "Releases.rst row 1.6.0 and pytorch/FBGEMM PR 5503 ('No changes to the release matrix vs "
        "v1.5.0'): ROCm 7.0/7.1; 1.6.0 corresponds to 2.11.x (pytorch/FBGEMM PR 5941). "
        "Unverified: FBGEMM's release pipeline built 1.6.0 against PyTorch's ROCm 7.1/7.2 "
        "channel, which the table does not list"
    ),
    "fbgemm-1.7": (
        "pytorch/test-infra PR 8101: FBGEMM_GPU 1.7.0 'aligns with PyTorch 2.12.x'; its ROCm "
        "row (7.0/7.1) is only inferred in the open pytorch/FBGEMM PR 5977, and the release "
        "pipeline built 1.7.0 against the ROCm 7.1/7.2 channel"
    ),
    "fbgemm-1.8": (
        "pytorch/test-infra PRs 8431/8519: FBGEMM_GPU 1.8.0 'aligns with PyTorch 2.13'; no "
        "published ROCm matrix for 1.8"
    ),
    "fbgemm-1.9": "pytorch/FBGEMM PR 6254: 'v1.9.0 -> torch 2.14'",
    "torchrec": "torchrec releases follow fbgemm-gpu's version (torchrec 1.8 needs fbgemm-gpu 1.8)",
}

#: torch minor → the ROCm its release is built for (source: ``torch-release``)
TORCH_STABLE_ROCM: dict[MM, MM] = {
    (2, 6): (6, 2),
    (2, 7): (6, 3),
    (2, 8): (6, 4),
    (2, 9): (6, 4),
    (2, 10): (7, 1),
    (2, 11): (7, 2),
    (2, 12): (7, 2),
    (2, 13): (7, 2),
    (2, 14): (7, 14),
}

#: fbgemm-gpu minor → the torch minor it is built against (its C++ ABI is per torch minor)
FBGEMM_TORCH: dict[MM, MM] = {
    (1, 0): (2, 5),
    (1, 1): (2, 6),
    (1, 2): (2, 7),
    (1, 3): (2, 8),
    (1, 4): (2, 9),
    (1, 5): (2, 10),
    (1, 6): (2, 11),
    (1, 7): (2, 12),
    (1, 8): (2, 13),
    (1, 9): (2, 14),
}


@dataclass(frozen=True)
class FbgemmRocm:
    """The ROCm builds one fbgemm-gpu minor is published for (FBGEMM calls them experimental)."""

    rocm: tuple[tuple[int, ...], ...]
    """ROCm releases of the published wheels (``(6, 2, 4)`` where the table names a patch level;
    compared by minor, because ``torch.version.hip``'s third field is a build number)."""
    archs: tuple[str, ...]
    """GPU architectures those wheels are built for."""
    source: str
    """Key of :data:`SOURCES`."""
    verified: bool = True
    """False when no published matrix states the row (the doctor then does not warn on it)."""


_ARCHS_1_5 = ("gfx908", "gfx90a", "gfx942", "gfx950")
_ARCHS_1_1 = ("gfx908", "gfx90a", "gfx942")

#: fbgemm-gpu minor → its ROCm builds, as FBGEMM's table lists them (1.2: ROCm 6.2.4 and 6.3;
#: 1.3: ROCm 6.3/6.4; tests/diagnostics/test_versions_compat.py compares every row with a recorded
#: copy of the table). 1.6 and 1.7 are unverified: the docs say ROCm 7.0/7.1,
#: but the release pipeline built them against the 7.1/7.2 channel, so torch 2.11 + ROCm 7.2 +
#: fbgemm-gpu 1.6 may well be a published pairing and the doctor does not warn on it.
FBGEMM_ROCM: dict[MM, FbgemmRocm] = {
    (1, 0): FbgemmRocm(((6, 0), (6, 1)), ("gfx908", "gfx90a"), "fbgemm-releases"),
    (1, 1): FbgemmRocm(((6, 1), (6, 2, 4), (6, 3)), _ARCHS_1_1, "fbgemm-releases"),
    (1, 2): FbgemmRocm(((6, 2, 4), (6, 3)), _ARCHS_1_1, "fbgemm-releases"),
    (1, 3): FbgemmRocm(((6, 3), (6, 4)), _ARCHS_1_1, "fbgemm-releases"),
    (1, 4): FbgemmRocm(((6, 3), (6, 4)), _ARCHS_1_1, "fbgemm-releases"),
    (1, 5): FbgemmRocm(((7, 0), (7, 1)), _ARCHS_1_5, "fbgemm-releases"),
    (1, 6): FbgemmRocm(((7, 0), (7, 1)), _ARCHS_1_5, "fbgemm-1.6", verified=False),
    (1, 7): FbgemmRocm(((7, 0), (7, 1)), _ARCHS_1_5, "fbgemm-1.7", verified=False),
}


@dataclass(frozen=True)
class Stack:
    """One pinned set of versions: what the README installs and the Dockerfiles build."""

    torch: str
    fbgemm_gpu: str
    torchrec: str
    rocm: str
    """ROCm minor of the ROCm image and of PyTorch's wheel index (``whl/rocm<rocm>``)."""
    cuda: str
    """CUDA minor of the NVIDIA image and of PyTorch's wheel index (``whl/cu<digits>``)."""
    rocm_base_image: str
    """``FROM`` of ``scripts/container/Dockerfile.rocm``: the ROCm user space, no torch (the
    torch wheel brings its own HIP libraries). Tag seen in public Dockerfiles; not checked
    against Docker Hub here (no registry reachable)."""
    cuda_base_image: str
    """``FROM`` of ``scripts/container/Dockerfile.cuda`` (same caveat)."""

    def wheel_index(self, accelerator: str) -> str:
        """PyTorch's wheel index for ``rocm`` or ``cuda`` builds of this stack."""
        if accelerator == "rocm":
            return f"https://download.pytorch.org/whl/rocm{self.rocm}"
        if accelerator == "cuda":
            return f"https://download.pytorch.org/whl/cu{self.cuda.replace('.', '')}"
        raise ValueError(f"accelerator {accelerator!r}: use 'rocm' or 'cuda'")


#: the stack the README and the containers pin (torch 2.13 ↔ ROCm 7.2 ↔ fbgemm-gpu 1.8 ↔
#: torchrec 1.8; CUDA 13.0 is one of torch 2.13's stable CUDA builds)
PINNED = Stack(
    torch="2.13.0",
    fbgemm_gpu="1.8.0",
    torchrec="1.8.0",
    rocm="7.2",
    cuda="13.0",
    rocm_base_image="rocm/dev-ubuntu-24.04:7.2.4",
    cuda_base_image="nvidia/cuda:13.0.2-runtime-ubuntu24.04",
)


def minor(version: str | tuple[int, ...] | None) -> MM | None:
    """``(major, minor)`` of ``'2.13.0+rocm7.2'`` / ``(2, 13, 0)``; None when unparsable."""
    if version is None:
        return None
    if isinstance(version, str):
        parts = version.split("+")[0].split(".")
        try:
            return int(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            return None
    return (int(version[0]), int(version[1])) if len(version) >= 2 else None


def stable_rocm(torch_mm: MM | None) -> MM | None:
    """The ROCm a torch minor was released against (None: not in the table)."""
    return TORCH_STABLE_ROCM.get(torch_mm) if torch_mm else None


def fbgemm_for_torch(torch_mm: MM | None) -> MM | None:
    """The fbgemm-gpu minor built for a torch minor: the table, else the pattern 1.x ↔ 2.(x+5)."""
    if torch_mm is None:
        return None
    for fb, tv in FBGEMM_TORCH.items():
        if tv == torch_mm:
            return fb
    if torch_mm[0] == 2 and torch_mm[1] >= 5:
        return (1, torch_mm[1] - 5)
    return None


def fbgemm_rocm(fbgemm_mm: MM | None) -> FbgemmRocm | None:
    """The ROCm builds of an fbgemm-gpu minor (None: no row, published or inferred)."""
    return FBGEMM_ROCM.get(fbgemm_mm) if fbgemm_mm else None


def rocm_minors(row: FbgemmRocm) -> set[MM]:
    """The ROCm minors of a row (``(6, 2, 4)`` → ``(6, 2)``)."""
    return {(r[0], r[1]) for r in row.rocm}
