"""Spec loading: every built-in validates and has sources; bad specs are one-line SpecErrors."""

import math

import pytest

from planner.catalog import list_hardware, load_hardware_any, load_model, load_system
from planner.errors import SpecError
from planner.spec.hardware import Device, Link, Precision


def test_every_builtin_hardware_loads_with_sources():
    from planner.catalog import load_target

    for name in list_hardware()["clusters"]:
        assert len(load_target(name).pools) > 1
    for kind, names in list_hardware().items():
        for name in names if kind != "clusters" else ():
            spec = load_hardware_any(name)
            if isinstance(spec, Device | Link):
                assert spec.sources


def test_required_builtins_exist():
    hw = list_hardware()
    for d in ["k80", "titan-x-maxwell", "xeon-phi-7250", "p100-sxm2-16gb", "v100-sxm2-32gb",
              "a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb"]:
        assert d in hw["devices"]
    for link in ["pcie3-x16", "nvlink-v100", "nvswitch-a100", "nvswitch-h100", "10gbe",
                 "100gbe", "fdr-ib", "edr-ib", "hdr-ib", "ndr-ib", "omnipath-100"]:
        assert link in hw["links"]
    for s in ["k80-fdr", "dgx1-v100", "dgx-a100-80gb", "dgx-h100"]:
        assert s in hw["systems"]


def test_units_are_converted_once_at_load():
    sysm = load_system("dgx-a100-80gb")
    assert sysm.device.memory_bytes == 80 * 2**30
    assert sysm.device.peak_flops(Precision.bf16) == 312e12
    assert sysm.device.peak_flops(Precision.tf32) == 156e12
    assert math.isclose(sysm.inter_node_bandwidth_Bps, 8 * 25e9 * sysm.inter_node.efficiency)


def _write(tmp_path, text, name="spec.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text, fragment", [
    ("kind: device\nname: x\n", "missing key"),
    ("kind: link\nname: l\nbandwidth_GBps: -1\nlatency_us: 1\nefficiency: 0.9\n"
     "sources: {a: b}\n", "bandwidth_GBps"),
    ("kind: link\nname: l\nbandwidth_GBps: .nan\nlatency_us: 1\nefficiency: 0.9\n"
     "sources: {a: b}\n", "bandwidth_GBps"),
    ("kind: link\nname: l\nbandwidth_GBps: '12'\nlatency_us: 1\nefficiency: 0.9\n"
     "sources: {a: b}\n", "bandwidth_GBps"),
    ("kind: link\nname: l\nbandwidth_GBps: 1\nlatency_us: 1\nefficiency: 0.9\n"
     "sources: {a: b}\ncolour: red\n", "unknown key 'colour'"),
    ("kind: system\nname: s\ndevice: nope\ndevices_per_node: 1\nintra_node: pcie3-x16\n"
     "inter_node: {link: fdr-ib, count: 1}\n", "unknown device 'nope'"),
    ("[1, 2]\n", "must be a mapping"),
    ("", "empty document"),
    ("kind: system\nname: [unclosed\n", "malformed YAML"),
])
def test_bad_hardware_is_a_one_line_spec_error(tmp_path, text, fragment):
    path = _write(tmp_path, text)
    with pytest.raises(SpecError) as err:
        load_hardware_any(path)
    assert fragment in str(err.value)
    assert str(err.value).count("\n") < 10  # one line per mistake, up to 10


@pytest.mark.parametrize("layers, fragment", [
    ("[{type: conv, out: 8, kernel: 50}]", "larger than its padded input"),
    ("[{type: conv, out: 8, kernel: 3, groups: 2}]", "groups=2 must divide"),
    ("[{type: warp}]", "unknown layer type"),
    ("[{type: conv, out: 0, kernel: 3}]", "out"),
    ("[{type: conv, out: 2.5, kernel: 3}]", "out"),
    ("[{block: missing}]", "unknown block"),
    ("[{type: concat, branches: [[{type: conv, out: 4, kernel: 1}], "
     "[{type: conv, out: 4, kernel: 3}]]}]", "spatial size"),
])
def test_bad_cnn_is_a_one_line_spec_error(tmp_path, layers, fragment):
    path = _write(tmp_path, f"kind: cnn\nname: bad\ninput: [3, 16, 16]\nlayers: {layers}\n")
    with pytest.raises(SpecError) as err:
        load_model(path)
    assert fragment in str(err.value)
    assert path in str(err.value)


def test_alias_bomb_is_refused(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 14):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 9)}]")
    path = _write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(SpecError, match="aliases"):
        load_model(path)


def test_block_templates_fill_placeholders_by_lookup_only(tmp_path):
    path = _write(tmp_path, """
kind: cnn
name: tiny
input: [3, 8, 8]
blocks:
  cb:
    params: [w]
    layers: [{type: conv, out: $w, kernel: 3, padding: 1}, {type: relu}]
layers:
  - {block: cb, name: s, repeat: 2, args: {w: 4}, then: {w: 6}}
  - {type: fc, name: fc, out: 10}
""")
    cnn = load_model(path)
    convs = [l for l in cnn.layers if l.type == "conv"]
    assert [c.output_shape[0] for c in convs] == [4, 6]
    assert cnn.params == (4 * 3 * 9 + 4) + (6 * 4 * 9 + 6) + (6 * 64 * 10 + 10)


def test_exponent_floats_read_as_numbers(tmp_path):
    """PyYAML alone reads 1e-3 as a string; specs accept it as the float people mean."""
    from planner.catalog import load_link

    path = tmp_path / "l.yaml"
    path.write_text("kind: link\nname: l\nbandwidth_GBps: 1e-3\nlatency_us: 2E+1\nefficiency: 1\n"
                    "sources: {x: y}\n")
    link = load_link(str(path))
    assert link.bandwidth_GBps == 1e-3 and link.latency_us == 20.0
