"""The 2025-2026 hardware built-ins (issue 15): Blackwell and AMD devices, their links and systems,
scale-up domains, host offload and the low-precision GEMM formats."""

import math

import pytest

from planner.catalog import list_hardware, load_device, load_link, load_system
from planner.errors import SpecError
from planner.spec.hardware import Precision

DEVICES = ["b200", "gb200", "b300", "gb300", "mi300x", "mi325x", "mi350x", "mi355x",
           "h200-sxm-141gb"]
LINKS = ["nvlink5-nvswitch", "xdr-ib", "roce-400g", "roce-800g", "infinity-fabric-cdna3",
         "infinity-fabric-cdna4", "nvlink-c2c"]
SYSTEMS = ["dgx-b200", "dgx-b300", "gb200-nvl72", "gb300-nvl72", "hgx-h200", "mi300x-8",
           "mi325x-8", "mi350x-8", "mi355x-8"]


def test_builtins_listed_and_load():
    hw = list_hardware()
    assert set(DEVICES) <= set(hw["devices"])
    assert set(LINKS) <= set(hw["links"])
    assert set(SYSTEMS) <= set(hw["systems"])
    for name in SYSTEMS:
        system = load_system(name)
        if name != "hgx-h200":  # the H200 spec keeps its fp16 default (pinned by older tests)
            assert system.device.default_precision is Precision.bf16
        assert system.device.efficiency.matmul is not None


@pytest.mark.parametrize("name", DEVICES)
def test_every_device_number_has_a_source(name):
    d = load_device(name)
    keys = set(d.sources)
    assert {"peak_tflops", "memory", "efficiency"} <= keys
    if d.price_per_hour_usd is not None:
        assert "price" in keys
    for precision in d.peak_tflops:  # each peak is named in its source line
        assert precision.value in d.sources["peak_tflops"].lower(), precision
    # each efficiency value set is stated in the efficiency source
    eff = d.sources["efficiency"]
    for field in ("compute", "memory", "matmul"):
        value = getattr(d.efficiency, field)
        if value is not None and name != "h200-sxm-141gb":
            assert f"{field} {value:g}" in eff, (field, value)


@pytest.mark.parametrize("name", LINKS)
def test_every_link_number_has_a_source(name):
    link = load_link(name)
    assert {"bandwidth", "latency", "efficiency"} <= set(link.sources)


def test_datasheet_peaks():
    b200 = load_device("b200")
    assert b200.peak_flops(Precision.nvfp4) == 9000e12  # DGX B200: 144 PF sparse FP4 / 8 / 2
    assert b200.peak_flops(Precision.mxfp8) == b200.peak_flops(Precision.fp8) == 4500e12
    assert b200.peak_flops(Precision.bf16) == 2250e12
    assert load_device("gb200").peak_flops(Precision.nvfp4) == 10000e12
    assert load_device("gb300").peak_flops(Precision.fp4) == 15000e12
    assert load_device("mi300x").peak_flops(Precision.bf16) == pytest.approx(1307.4e12)
    assert load_device("mi355x").peak_flops(Precision.fp4) == pytest.approx(10066.3e12)
    # MI350X: the same die at 2.2 GHz (MI355X 2.4 GHz): every peak in that ratio
    mi350x, mi355x = load_device("mi350x"), load_device("mi355x")
    for p in (Precision.bf16, Precision.fp8, Precision.fp4, Precision.fp64):
        assert mi350x.peak_flops(p) == pytest.approx(mi355x.peak_flops(p) * 2.2 / 2.4, rel=1e-3)


@pytest.mark.parametrize("device, precision", [
    ("h100-sxm5-80gb", Precision.nvfp4),   # Hopper: fp8 but no MX / FP4 hardware
    ("h100-sxm5-80gb", Precision.mxfp8),   # no fallback from mxfp8 to the fp8 peak
    ("mi300x", Precision.mxfp8),           # CDNA 3 likewise
    ("mi355x", Precision.nvfp4),           # NVFP4 is NVIDIA's format; CDNA 4 has MXFP4 (fp4)
])
def test_missing_low_precision_is_a_clear_error(device, precision):
    with pytest.raises(SpecError, match=f"no peak for precision '{precision.value}'"):
        load_device(device).peak_flops(precision)


def test_precision_properties():
    assert [p for p in Precision if p.gemm_only] == [Precision.fp8, Precision.mxfp8,
                                                     Precision.nvfp4, Precision.fp4]
    for p in Precision:
        assert isinstance(p.bytes, int) and isinstance(p.storage_bytes, int)
        assert p.storage_bytes == (2 if p.gemm_only else p.bytes)
    assert Precision.fp8.bytes == Precision.mxfp8.bytes == 1  # unchanged for fp8
    assert Precision.bf16.storage_bytes == 2 and Precision.fp32.storage_bytes == 4


def test_scale_up_domains():
    nvl72 = load_system("gb200-nvl72")
    assert (nvl72.devices_per_node, nvl72.devices_per_scale_up_domain) == (4, 72)
    assert nvl72.nodes_per_scale_up_domain == 18
    assert nvl72.scale_up_link is nvl72.intra_node
    assert nvl72.scale_up_link.bandwidth_GBps == 900
    # C2C: 450 GB/s per direction x 0.8, shared by the 2 GPUs of a superchip
    assert math.isclose(nvl72.host_offload_bandwidth_Bps, 450e9 * 0.8 / 2)
    dgx = load_system("dgx-b200")
    assert dgx.devices_per_scale_up_domain == dgx.devices_per_node == 8
    assert dgx.nodes_per_scale_up_domain == 1 and dgx.host_offload_bandwidth_Bps is None


def _system_yaml(tmp_path, extra: str) -> str:
    p = tmp_path / "sys.yaml"
    p.write_text("kind: system\nname: s\ndevice: b200\ndevices_per_node: 4\n"
                 "intra_node: nvlink5-nvswitch\ninter_node: {link: ndr-ib, count: 4}\n" + extra)
    return str(p)


def test_scale_up_link_named_in_yaml(tmp_path):
    s = load_system(_system_yaml(tmp_path, "devices_per_scale_up_domain: 8\n"
                                            "scale_up: xdr-ib\n"))
    assert s.scale_up_link.name == "xdr-ib" and s.intra_node.name == "nvlink5-nvswitch"


@pytest.mark.parametrize("domain", [6, 2, 0])
def test_scale_up_domain_errors_via_cli(tmp_path, run, domain):
    path = _system_yaml(tmp_path, f"devices_per_scale_up_domain: {domain}\n")
    code, out, err = run("show", "hardware", path)
    assert code == 2, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "devices_per_scale_up_domain" in lines[0], err
    assert "Traceback" not in err
    if domain:
        assert "multiple of devices_per_node = 4" in lines[0]


def test_unknown_scale_up_link_names_the_key(tmp_path):
    path = _system_yaml(tmp_path, "scale_up: nope\n")
    with pytest.raises(SpecError, match="key 'scale_up': unknown link 'nope'"):
        load_system(path)


def test_cli_accepts_new_precisions_and_smoke_evaluate(run):
    code, out, err = run("evaluate", "-m", "llama3-70b", "-H", "dgx-b200", "--devices", "64",
                         "--tp", "8", "--pp", "2", "--micro-batch", "1", "--global-batch", "512",
                         "--recompute", "selective")
    assert code == 0, err
    code, out, err = run("evaluate", "-m", "llama3-70b", "-H", "gb200-nvl72", "--devices", "64",
                         "--tp", "4", "--pp", "2", "--micro-batch", "1", "--global-batch", "512",
                         "--precision", "nvfp4")
    assert code == 0, err
    code, out, err = run("evaluate", "-m", "llama3-70b", "-H", "dgx-h100", "--devices", "64",
                         "--tp", "8", "--pp", "2", "--global-batch", "512", "--precision", "nvfp4")
    assert code == 2 and "no peak for precision 'nvfp4'" in err, (out, err)


@pytest.mark.parametrize("name", ["lab-a100-h100", "mixed-hopper-blackwell"])
def test_show_a_cluster_and_load_its_yaml_back(tmp_path, run, run_json, name):
    from planner.catalog import load_target

    code, out, err = run("show", "hardware", name)
    assert code == 0, err
    cluster = load_target(name)
    for pool in cluster.pools:
        assert f"pool {pool.name}" in out and f"{pool.nodes} x {pool.system.name}" in out
    doc = run_json("show", "hardware", name)
    assert doc["kind"] == "cluster" and [p["nodes"] for p in doc["pools"]] == [
        p.nodes for p in cluster.pools]
    code, out, err = run("show", "hardware", name, "--format", "yaml")
    path = tmp_path / "cluster.yaml"
    path.write_text(out)
    assert load_target(str(path)) == cluster
