"""GpuSampler against the real NVML: the fake's shapes must match what the driver returns."""

from __future__ import annotations

from types import ModuleType

import pytest

from executors.health.gpu import GpuSampler, _handle_key

pytestmark = pytest.mark.gpu


@pytest.fixture
def pynvml() -> ModuleType:
    """The real binding, or a skip where this host has no working NVML."""
    nvml = pytest.importorskip("pynvml")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        pytest.skip(f"NVML does not initialise here: {e}")
    try:
        if nvml.nvmlDeviceGetCount() < 1:
            pytest.skip("NVML reports no devices")
    finally:
        nvml.nvmlShutdown()
    return nvml


def test_real_nvml_reads_device_0(pynvml: ModuleType) -> None:
    with GpuSampler(nvml=pynvml) as s:
        assert s.status.startswith("ok: ")
        gpus = s.sample()
        assert len(gpus) == s.device_count >= 1
        g = gpus[0]
        assert g.index == 0
        assert isinstance(g.name, str)
        assert g.name
        assert not g.lost
        assert g.mem_total_mb is not None
        assert g.mem_total_mb > 0
        assert g.mem_used_mb is not None
        assert 0 <= g.mem_used_mb <= g.mem_total_mb
        assert g.temp_c is not None
        assert 0 < g.temp_c < 130
        assert g.util_pct is None or 0 <= g.util_pct <= 100
        assert g.power_w is None or 0 < g.power_w < 2000  # watts, not milliwatts
        assert all(isinstance(x, int) for x in g.xids)
        # a second sample drains the (empty) event set again without blocking or raising
        assert [x.index for x in s.sample()] == [x.index for x in gpus]


def test_real_handles_match_by_address(pynvml: ModuleType) -> None:
    """XID events carry a fresh handle object; matching must go by the pointer value."""
    with GpuSampler(nvml=pynvml) as s:
        again = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert s._keys[_handle_key(again)] == 0
