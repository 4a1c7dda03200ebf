"""GPU and host health sampling, against the NVML fake (no GPU needed)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import time
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
from support.helpers import cgroup_here

from executors.health import health as health_mod
from executors.health.gpu import FAKE_NVML_ENV, GpuSampler, _handle_key, load_nvml, throttle_names
from executors.health.health import HealthSampler, _Rate
from executors.testing.gpu_fake import FakeNvml, NVMLError, write_state
from protocol.messages import GpuHealth, Health

ROOT = Path(__file__).resolve().parents[2]


def faulty_state() -> dict[str, Any]:
    """Device 0 is in trouble in every way NVML can say; device 1 is healthy."""
    return {
        "devices": [
            {
                "name": "Fake A100",
                "util_pct": 87,
                "mem_used_mb": 30000,
                "mem_total_mb": 81920,
                "temp_c": 91,
                "power_w": 412.5,
                "throttle": ["hw_thermal", "sw_power_cap", "gpu_idle", "app_clocks"],
                "ecc_corrected": 3,
                "ecc_uncorrected": 2,
                "retired_pages_sbe": 1,
                "retired_pages_dbe": 2,
                "remapped_rows_corrected": 4,
                "remapped_rows_uncorrected": 1,
                "remap_pending": True,
                "remap_failure": True,
                "pcie_replays": 7,
                "xids": [79],
            },
            {
                "name": "Fake A100 #1",
                "util_pct": 5,
                "mem_used_mb": 1024,
                "mem_total_mb": 40960,
                "temp_c": 38,
                "power_w": 61.0,
            },
        ]
    }


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml.from_state(faulty_state())


@pytest.fixture
def sampler(fake: FakeNvml) -> Iterator[GpuSampler]:
    s = GpuSampler(nvml=fake)
    yield s
    s.close()


# ----------------------------------------------------------------- GpuSampler on the fake


def test_every_field_lands_in_health(sampler: GpuSampler, tmp_path: Path) -> None:
    h = HealthSampler(tmp_path, gpu=sampler).sample()
    assert h.gpu_status == "ok: 2 GPUs"
    assert [g.index for g in h.gpus] == [0, 1]
    bad, good = h.gpus
    assert bad == GpuHealth(
        index=0,
        name="Fake A100",
        util_pct=87.0,
        mem_used_mb=30000.0,
        mem_total_mb=81920.0,
        temp_c=91.0,
        power_w=412.5,
        throttle=("sw_power_cap", "hw_thermal"),  # idle / app clocks are not trouble
        ecc_corrected=3,
        ecc_uncorrected=2,
        retired_pages_sbe=1,
        retired_pages_dbe=2,
        remapped_rows_corrected=4,
        remapped_rows_uncorrected=1,
        remap_pending=True,
        remap_failure=True,
        pcie_replays=7,
        xids=(79,),
        lost=False,
    )
    assert good == GpuHealth(
        index=1,
        name="Fake A100 #1",
        util_pct=5.0,
        mem_used_mb=1024.0,
        mem_total_mb=40960.0,
        temp_c=38.0,
        power_w=61.0,
        throttle=(),
        ecc_corrected=0,
        ecc_uncorrected=0,
        retired_pages_sbe=0,
        retired_pages_dbe=0,
        remapped_rows_corrected=0,
        remapped_rows_uncorrected=0,
        remap_pending=False,
        remap_failure=False,
        pcie_replays=0,
        xids=(),
    )
    # and it survives the wire
    back = msgspec.json.decode(msgspec.json.encode(h), type=Health)
    assert back.gpus == h.gpus


def test_xids_are_reported_once(fake: FakeNvml, sampler: GpuSampler) -> None:
    assert [g.xids for g in sampler.sample()] == [(79,), ()]
    assert [g.xids for g in sampler.sample()] == [(), ()]
    fake.inject_xid(1, 48)
    fake.inject_xid(1, 63)
    fake.inject_xid(0, 94)
    assert [g.xids for g in sampler.sample()] == [(94,), (48, 63)]
    assert [g.xids for g in sampler.sample()] == [(), ()]


def test_handles_and_names_are_read_once(fake: FakeNvml, sampler: GpuSampler) -> None:
    for _ in range(3):
        sampler.sample()
    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 2
    assert fake.calls["nvmlDeviceGetName"] == 2
    assert fake.calls["nvmlDeviceRegisterEvents"] == 2
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 3 * 2 * 2  # samples * devices * types
    assert fake.calls["nvmlDeviceGetRetiredPages"] == 3 * 2 * 2  # samples * devices * causes


def test_not_supported_counter_is_none_rest_still_read() -> None:
    state = faulty_state()
    state["devices"][0]["unsupported"] = [
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceRegisterEvents",
    ]
    state["devices"][1]["xids"] = [13]
    with GpuSampler(nvml=FakeNvml.from_state(state)) as s:
        bad, good = s.sample()
    assert bad.pcie_replays is None
    assert bad.ecc_corrected is None
    assert bad.ecc_uncorrected is None
    assert bad.power_w is None
    assert bad.remapped_rows_corrected is None
    assert bad.remap_pending is None
    assert bad.remap_failure is None
    assert bad.xids == ()  # no event registration on this board, so no XIDs from it
    # ... while everything else on it, and the other device, still reads
    assert bad.temp_c == 91.0
    assert bad.retired_pages_dbe == 2
    assert bad.throttle == ("sw_power_cap", "hw_thermal")
    assert not bad.lost
    assert good.pcie_replays == 0
    assert good.ecc_uncorrected == 0
    assert good.xids == (13,)


def test_throttle_falls_back_to_old_name_on_old_driver() -> None:
    state = faulty_state()
    state["missing"] = ["nvmlDeviceGetCurrentClocksEventReasons"]
    fake = FakeNvml.from_state(state)
    with GpuSampler(nvml=fake) as s:
        assert s.sample()[0].throttle == ("sw_power_cap", "hw_thermal")
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2


def test_temperature_falls_back_when_old_call_is_gone() -> None:
    state = faulty_state()
    state["missing"] = ["nvmlDeviceGetTemperature"]
    fake = FakeNvml.from_state(state)
    with GpuSampler(nvml=fake) as s:
        assert [g.temp_c for g in s.sample()] == [91.0, 38.0]
    assert fake.calls["nvmlDeviceGetTemperatureV"] == 2


def test_throttle_names_decode_bits() -> None:
    assert throttle_names(0) == []
    assert throttle_names(0x1 | 0x2 | 0x100) == []
    assert throttle_names(0x8 | 0x80) == ["hw_slowdown", "hw_power_brake"]
    assert throttle_names(0x20) == ["sw_thermal"]


def test_lost_gpu_is_reported_as_lost(fake: FakeNvml, sampler: GpuSampler) -> None:
    assert not any(g.lost for g in sampler.sample())
    fake.lose(0)
    lost, good = sampler.sample()
    assert lost.lost is True
    assert lost.name == "Fake A100"  # remembered from init, so the operator knows which
    assert lost.temp_c is None
    assert lost.mem_total_mb is None
    assert lost.ecc_uncorrected is None
    assert not good.lost
    assert good.temp_c == 38.0
    # and it keeps being reported, not just once
    assert sampler.sample()[0].lost is True


def test_gpu_lost_before_init_is_reported_as_lost() -> None:
    state = faulty_state()
    state["devices"][1]["lost"] = True
    with GpuSampler(nvml=FakeNvml.from_state(state)) as s:
        assert s.status == "ok: 2 GPUs"
        first, lost = s.sample()
    assert lost == GpuHealth(index=1, lost=True)
    assert first.temp_c == 91.0


def test_close_shuts_nvml_down(fake: FakeNvml) -> None:
    s = GpuSampler(nvml=fake)
    s.close()
    s.close()
    assert fake.calls["nvmlShutdown"] == 1
    assert fake.calls["nvmlEventSetFree"] == 1
    assert not fake.initialized
    assert s.sample() == []
    assert s.status.startswith("no GPU")


# ----------------------------------------------------------------- no NVML


def test_loader_that_raises_means_no_gpu(tmp_path: Path) -> None:
    def broken() -> Any:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    s = GpuSampler(loader=broken)
    assert s.status.startswith("no GPU")
    assert s.sample() == []
    h = HealthSampler(tmp_path, gpu=s).sample()
    assert h.gpu_status.startswith("no GPU")
    assert h.gpus == ()


def test_loader_without_pynvml_means_no_gpu() -> None:
    s = GpuSampler(loader=lambda: None)
    assert s.status == "no GPU (pynvml not installed)"
    assert s.sample() == []


def test_nvml_library_not_found_means_no_gpu(tmp_path: Path) -> None:
    fake = FakeNvml.from_state({"init_error": "LIBRARY_NOT_FOUND", "devices": [{}]})
    s = GpuSampler(nvml=fake)
    assert s.status == "no GPU (NVML library not found)"
    assert s.sample() == []
    assert fake.calls["nvmlDeviceGetCount"] == 0
    h = HealthSampler(tmp_path, gpu=s).sample()
    assert h.gpu_status == "no GPU (NVML library not found)"
    assert h.gpus == ()
    s.close()
    assert fake.calls["nvmlShutdown"] == 0  # never initialised, so nothing to shut down


def test_driver_not_loaded_means_no_gpu() -> None:
    s = GpuSampler(nvml=FakeNvml.from_state({"init_error": 9, "devices": [{}]}))
    assert s.status == "no GPU (NVIDIA driver not loaded)"
    assert s.sample() == []


def test_real_pynvml_error_class_at_init(monkeypatch: pytest.MonkeyPatch) -> None:
    pynvml = pytest.importorskip("pynvml")

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    s = GpuSampler(nvml=pynvml)
    assert s.status == "no GPU (NVML library not found)"
    assert s.sample() == []


def test_zero_devices_means_no_gpu() -> None:
    fake = FakeNvml.from_state({"devices": []})
    s = GpuSampler(nvml=fake)
    assert s.status.startswith("no GPU")
    assert s.sample() == []
    assert fake.calls["nvmlShutdown"] == 1


# ----------------------------------------------------------------- the file-backed fake


def test_file_fake_picks_up_rewritten_state(tmp_path: Path) -> None:
    path = tmp_path / "nvml.json"
    state = faulty_state()
    state["devices"][0]["xids"] = []
    write_state(path, state)
    fake = FakeNvml(path)
    with GpuSampler(nvml=fake) as s:
        first = s.sample()[0]
        assert first.ecc_uncorrected == 2
        assert first.xids == ()
        loads = fake.loads
        s.sample()
        assert fake.loads == loads  # unchanged file: not re-read

        state["devices"][0]["ecc_uncorrected"] = 3
        state["devices"][0]["xids"] = [48]
        write_state(path, state)
        second = s.sample()[0]
        assert second.ecc_uncorrected == 3
        assert second.xids == (48,)
        assert s.sample()[0].xids == ()  # the file still lists 48: delivered once only

        # another process (here: another fake on the same file) injects faults
        injector = FakeNvml(path)
        injector.inject_ecc_dbe(0)
        injector.inject_xid(0, 79)
        injector.set_throttle(1, "hw_slowdown")
        d0, d1 = s.sample()
        assert d0.ecc_uncorrected == 4
        assert d0.xids == (79,)
        assert d1.throttle == ("hw_slowdown",)

        injector.lose(1)
        assert s.sample()[1].lost is True
    assert list(tmp_path.iterdir()) == [path]  # atomic writes leave no temp files


def test_file_fake_missing_file_means_no_gpu(tmp_path: Path) -> None:
    s = GpuSampler(nvml=FakeNvml(tmp_path / "absent.json"))
    assert s.status == "no GPU (NVML library not found)"
    assert s.sample() == []


def test_env_var_selects_the_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "nvml.json"
    write_state(path, faulty_state())
    monkeypatch.setenv(FAKE_NVML_ENV, str(path))
    nvml = load_nvml()
    assert isinstance(nvml, FakeNvml)
    assert nvml.path == path
    with GpuSampler() as s:
        assert s.status == "ok: 2 GPUs"
        assert s.sample()[0].xids == (79,)


def test_without_env_var_loads_real_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    pynvml = pytest.importorskip("pynvml")
    monkeypatch.delenv(FAKE_NVML_ENV, raising=False)
    assert load_nvml() is pynvml


def test_importing_gpu_module_does_not_import_pynvml() -> None:
    code = (
        "import sys, executors.health.gpu, executors.health.health; print('pynvml' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_fake_errors_look_like_pynvml() -> None:
    fake = FakeNvml.from_state({"devices": [{"unsupported": ["nvmlDeviceGetPowerUsage"]}]})
    with pytest.raises(NVMLError) as e:
        fake.nvmlDeviceGetCount()
    assert e.value.value == fake.NVML_ERROR_UNINITIALIZED
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(fake.NVMLError) as e:
        fake.nvmlDeviceGetPowerUsage(h)
    assert e.value.value == fake.NVML_ERROR_NOT_SUPPORTED
    events = fake.nvmlEventSetCreate()
    with pytest.raises(NVMLError) as e:
        fake.nvmlEventSetWait(events, 0)
    assert e.value.value == fake.NVML_ERROR_TIMEOUT


def test_handle_key_compares_ctypes_pointers_by_address() -> None:
    class Dev(ctypes.Structure):
        _fields_ = [("x", ctypes.c_int)]

    a, b = Dev(), Dev()
    p1, p2, q = ctypes.pointer(a), ctypes.pointer(a), ctypes.pointer(b)
    assert p1 is not p2
    assert _handle_key(p1) == _handle_key(p2)
    assert _handle_key(p1) != _handle_key(q)


# ----------------------------------------------------------------- HealthSampler


def no_gpu() -> GpuSampler:
    return GpuSampler(loader=lambda: None)


def test_host_sample_is_sane(tmp_path: Path) -> None:
    hs = HealthSampler(tmp_path, gpu=no_gpu())
    before = time.time()
    first = hs.sample()
    second = hs.sample()
    after = time.time()
    assert before <= first.t <= second.t <= after

    usage = shutil.disk_usage(tmp_path)
    mib = 1024 * 1024
    assert first.disk_total_mb == pytest.approx(usage.total / mib, rel=1e-6)
    assert 0 < first.disk_free_mb <= first.disk_total_mb
    assert first.disk_free_mb == pytest.approx(usage.free / mib, abs=0.01 * usage.total / mib)

    total_mem_mb = psutil.virtual_memory().total / mib
    for h in (first, second):
        assert 0.0 <= h.cpu_pct <= 100.0
        assert 0.0 < h.mem_used_pct < 100.0
        assert 0.0 < h.mem_available_mb <= total_mem_mb
        for rate in (h.disk_read_bps, h.disk_write_bps, h.net_rx_bps, h.net_tx_bps):
            assert rate >= 0.0
    # no previous sample, so no rate yet
    assert (first.disk_read_bps, first.disk_write_bps) == (0.0, 0.0)
    assert (first.net_rx_bps, first.net_tx_bps) == (0.0, 0.0)
    assert first.gpu_status == "no GPU (pynvml not installed)"
    assert first.gpus == ()


def test_disk_of_a_workdir_not_yet_created(tmp_path: Path) -> None:
    h = HealthSampler(tmp_path / "not" / "yet", gpu=no_gpu()).sample()
    assert h.disk_total_mb == pytest.approx(shutil.disk_usage(tmp_path).total / 1024 / 1024)


def test_rates_are_deltas_over_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Disk = namedtuple("Disk", "read_bytes write_bytes")
    Net = namedtuple("Net", "bytes_recv bytes_sent")
    reads = iter([Disk(1_000, 5_000), Disk(1_000 + 10**9, 5_000)])
    nets = iter([Net(0, 0), Net(10**9, 2 * 10**9)])
    monkeypatch.setattr(health_mod.psutil, "disk_io_counters", lambda: next(reads))
    monkeypatch.setattr(health_mod.psutil, "net_io_counters", lambda: next(nets))
    hs = HealthSampler(tmp_path, gpu=no_gpu())
    hs.sample()
    h = hs.sample()
    # a gigabyte in well under a minute of test time
    assert h.disk_read_bps > 10**9 / 60
    assert h.disk_write_bps == 0.0
    assert h.net_rx_bps > 10**9 / 60
    assert h.net_tx_bps == pytest.approx(2 * h.net_rx_bps)


def test_missing_or_broken_io_counters_give_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> None:
        raise RuntimeError("couldn't find any physical disk")

    monkeypatch.setattr(health_mod.psutil, "disk_io_counters", lambda: None)
    monkeypatch.setattr(health_mod.psutil, "net_io_counters", broken)
    hs = HealthSampler(tmp_path, gpu=no_gpu())
    for h in (hs.sample(), hs.sample()):
        assert (h.disk_read_bps, h.disk_write_bps, h.net_rx_bps, h.net_tx_bps) == (0, 0, 0, 0)


def test_rate_arithmetic() -> None:
    r = _Rate()
    assert r.update(10.0, 100.0) == 0.0  # first reading
    assert r.update(12.0, 300.0) == 100.0
    assert r.update(13.0, 50.0) == 0.0  # counter reset
    assert r.update(14.0, 150.0) == 100.0
    assert r.update(14.0, 250.0) == 0.0  # no time passed
    assert r.update(15.0, None) == 0.0
    assert r.update(16.0, 500.0) == 0.0  # restart after a gap


def test_health_sampler_owns_a_default_gpu_sampler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "nvml.json"
    write_state(path, faulty_state())
    monkeypatch.setenv(FAKE_NVML_ENV, str(path))
    hs = HealthSampler(tmp_path)
    assert hs.sample().gpu_status == "ok: 2 GPUs"
    fake = hs.gpu._nvml
    hs.close()
    assert isinstance(fake, FakeNvml)
    assert fake.calls["nvmlShutdown"] == 1


def test_the_fake_can_wobble_utilisation_around_a_value_for_the_demo() -> None:
    fake = FakeNvml.from_state({"devices": [{"util_pct": 50, "util_wave": 10}] * 2})
    fake.nvmlInit()
    handles = [fake.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    reads = [[fake.nvmlDeviceGetUtilizationRates(h).gpu for h in handles] for _ in range(12)]
    flat = [u for pair in reads for u in pair]
    assert all(40 <= u <= 60 for u in flat)
    assert len(set(flat)) > 4, "it moves from read to read"
    steady = FakeNvml.from_state({"devices": [{"util_pct": 50}]})
    steady.nvmlInit()
    h = steady.nvmlDeviceGetHandleByIndex(0)
    assert {steady.nvmlDeviceGetUtilizationRates(h).gpu for _ in range(5)} == {50}


def test_health_says_what_would_contain_a_run_here(tmp_path: Path) -> None:
    """``Health.containment`` (shown on the host screen) agrees with a cgroup made by hand."""
    h = HealthSampler(tmp_path, GpuSampler(nvml=FakeNvml(tmp_path / "absent.json"))).sample()
    why = cgroup_here()
    if why is None:
        assert h.containment == "cgroup"
    else:
        assert h.containment.startswith("fence: ") and len(h.containment) > len("fence: ")
    decoded = msgspec.json.decode(msgspec.json.encode(h), type=Health)
    assert decoded.containment == h.containment
    old = msgspec.json.encode(
        {k: v for k, v in msgspec.to_builtins(h).items() if k != "containment"}
    )
    assert msgspec.json.decode(old, type=Health).containment == "", "an older executor's sample"
