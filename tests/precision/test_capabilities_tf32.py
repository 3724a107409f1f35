"""TF32 on each arch: gfx90a has none, gfx942 maps it to XF32, gfx950 emulates it with bf16 MFMAs in
hipBLASLt (so the flag is not a no-op there), NVIDIA has tensor-core TF32."""

from __future__ import annotations

import pytest

from rocmtrain.precision.capabilities import capabilities_for


@pytest.mark.parametrize(
    "arch, xf32, impl",
    [("gfx90a", False, "none"), ("gfx942", True, "xf32"), ("gfx950", True, "bf16-emulated"),
     ("sm_80", True, "tf32"), ("sm_90", True, "tf32"), ("cpu", False, "none")],
)  # fmt: skip
def test_tf32_implementation_per_arch(arch: str, xf32: bool, impl: str) -> None:
    caps = capabilities_for(arch)
    assert caps.xf32 is xf32 and caps.tf32_impl == impl


def test_gfx950_note_names_the_emulation_not_fp32() -> None:
    notes = capabilities_for("gfx950:sramecc+:xnack-").notes
    assert "TF32 flags: fp32" not in notes
    assert "bf16 MFMAs" in notes and "hipBLASLt" in notes
