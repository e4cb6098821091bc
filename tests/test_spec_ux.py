"""Specs that are easy to write (issue 16, item 6): paths inside a YAML resolve against its
folder, every mistake of a spec in one message, "did you mean" for keys and built-in names, and
a device given as --hardware says it is a device."""

import json
from pathlib import Path

import pytest

from planner.catalog import HARDWARE, load_hardware_any, load_model, load_system, load_target
from planner.errors import SpecError
from planner.spec.base import MAX_ERRORS

K80 = (HARDWARE / "devices" / "k80.yaml").read_text()
FDR = (HARDWARE / "links" / "fdr-ib.yaml").read_text()


def _system(device: str, inter: str = "fdr-ib") -> str:
    return (f"kind: system\nname: s\ndescription: d\ndevice: {device}\ndevices_per_node: 2\n"
            f"intra_node: pcie3-x16\ninter_node: {{link: {inter}, count: 1}}\n"
            "sources: {layout: test}\n")


def test_paths_in_a_system_resolve_against_its_folder(tmp_path, monkeypatch):
    sub = tmp_path / "specs"
    (sub / "parts").mkdir(parents=True)
    (sub / "my-device.yaml").write_text(K80.replace("name: k80", "name: mine"))
    (sub / "parts" / "my-link.yaml").write_text(FDR.replace("name: fdr-ib", "name: lnk"))
    (sub / "sys.yaml").write_text(_system("my-device.yaml", "parts/my-link.yaml"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not the YAML's folder
    system = load_system(str(sub / "sys.yaml"))
    assert system.device.name == "mine" and system.inter_node.name == "lnk"
    assert system.intra_node.name == "pcie3-x16"  # built-in names keep working
    monkeypatch.chdir(tmp_path)
    assert load_system("specs/sys.yaml").device.name == "mine"


def test_a_missing_relative_part_names_the_path_next_to_the_yaml(tmp_path, monkeypatch):
    (tmp_path / "sys.yaml").write_text(_system("nope.yaml"))
    monkeypatch.chdir("/")
    with pytest.raises(SpecError) as err:
        load_system(str(tmp_path / "sys.yaml"))
    assert "key 'device'" in str(err.value) and str(tmp_path / "nope.yaml") in str(err.value)


def test_absolute_paths_in_a_yaml_stay_absolute(tmp_path):
    dev = tmp_path / "d" / "dev.yaml"
    dev.parent.mkdir()
    dev.write_text(K80)
    (tmp_path / "sys.yaml").write_text(_system(str(dev)))
    assert load_system(str(tmp_path / "sys.yaml")).device.name == "k80"


def test_every_error_of_a_spec_at_once_the_first_line_as_before(tmp_path):
    path = tmp_path / "dev.yaml"
    # one mistake: today's one-line message
    path.write_text(K80.replace("memory_GiB: 12", "memory_GiB: -12"))
    with pytest.raises(SpecError) as one:
        load_hardware_any(str(path))
    assert "\n" not in str(one.value) and "key 'memory_GiB'" in str(one.value)
    # three mistakes: three lines, the first the same message
    path.write_text(K80.replace("memory_GiB: 12", "memory_GiB: -12")
                    .replace("description:", "descripton:")
                    .replace("memory_bandwidth_GBps: 240", "memory_bandwidth_GBps: fast"))
    with pytest.raises(SpecError) as many:
        load_hardware_any(str(path))
    lines = str(many.value).splitlines()
    assert len(lines) == 3, lines  # memory_GiB, memory_bandwidth_GBps, the unknown key
    assert lines[0] == str(one.value)
    assert all(line.startswith(str(path)) for line in lines)
    text = str(many.value)
    assert "memory_GiB" in text and "memory_bandwidth_GBps" in text
    assert "unknown key 'descripton' (did you mean 'description'?)" in text


def test_a_system_with_mistakes_in_several_parts_names_them_all(tmp_path):
    """The system's own keys and every part written inline are checked together: a typo at
    the top, a device's negative memory and a link's negative bandwidth, three lines."""
    doc = (Path(__file__).parents[1] / "docs" / "hardware-yaml.md").read_text()
    system = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    bad = (system.replace("devices_per_node: 8 ", "devices_per_nod: 8 ", 1)
           .replace("  memory_GiB: 80", "  memory_GiB: -12", 1)
           .replace("  bandwidth_GBps: 450 ", "  bandwidth_GBps: -1 ", 1))
    path = tmp_path / "sys.yaml"
    path.write_text(bad)
    with pytest.raises(SpecError) as err:
        load_system(str(path))
    text = str(err.value)
    assert "unknown key 'devices_per_nod' (did you mean 'devices_per_node'?)" in text
    assert "key 'device.memory_GiB'" in text and "key 'intra_node.bandwidth_GBps'" in text
    path.write_text(system)
    assert load_system(str(path)).devices_per_node == 8


def test_a_cluster_with_several_wrong_names_names_them_all(tmp_path):
    """Each pool's system and the link between the pools are resolved before an error is
    raised: two misspelt names, two lines, each with its suggestion (it had named the first)."""
    text = (HARDWARE / "clusters" / "lab-a100-h100.yaml").read_text()
    path = tmp_path / "c.yaml"
    path.write_text(text.replace("dgx-a100-80gb,", "dgx-a100-80gbx,", 1)
                    .replace("link: ndr-ib,", "link: ndr-ibx,", 1))
    with pytest.raises(SpecError) as err:
        load_target(str(path))
    lines = str(err.value).splitlines()
    assert len(lines) == 2
    assert "pools.0.system" in lines[0] and "did you mean 'dgx-a100-80gb'" in lines[0]
    assert "between_pools.link" in lines[1] and "did you mean 'ndr-ib'" in lines[1]


def test_a_cluster_names_its_wrong_keys_and_wrong_names_in_one_run(tmp_path):
    """Validation's mistakes (a bad count, an unknown key) and the unknown system and link
    together, not the names only on the next run."""
    path = tmp_path / "c.yaml"
    path.write_text("kind: cluster\nname: x\npools:\n"
                    "  - {system: dgx-h10, nodes: 0}\n"
                    "  - {system: dgx-a100-80gb, nodes: 2, availabilty: 0.5}\n"
                    "between_pools: {link: ndr-ibb, count: 8}\n")
    with pytest.raises(SpecError) as err:
        load_target(str(path))
    lines = str(err.value).splitlines()
    assert len(lines) == 4, lines
    assert "pools.0.nodes" in lines[0] and "'availability'" in lines[1]
    assert "did you mean 'dgx-h100'" in lines[2] and "did you mean 'ndr-ib'" in lines[3]
    assert "mi355x-8" in lines[2] and "lab-a100-h100" not in lines[2]  # a pool is a system


def test_a_pool_naming_a_cluster_or_a_misspelt_kind_says_so(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("kind: cluster\nname: x\npools:\n  - {system: lab-a100-h100, nodes: 4}\n")
    with pytest.raises(SpecError, match="'lab-a100-h100' is a cluster; a pool is one system"):
        load_target(str(path))
    path.write_text("kind: clustr\nname: x\npools:\n  - {system: dgx-h100, nodes: 4}\n")
    with pytest.raises(SpecError, match="expected system or cluster, got 'clustr' "
                                        "\\(did you mean 'cluster'\\?\\)"):
        load_target(str(path))


def test_a_renamed_key_names_its_new_name(tmp_path, run):
    """A device YAML written before stop 31 (`kernels.graph_floor_us`) is told the key's new
    name, in one line, exit 2."""
    h100 = (HARDWARE / "devices" / "h100-sxm5-80gb.yaml").read_text()
    assert "kernel_gpu_us" in h100
    path = tmp_path / "old.yaml"
    path.write_text(h100.replace("kernel_gpu_us", "graph_floor_us"))
    code, _, err = run("show", "hardware", str(path))
    assert code == 2 and err.count("\n") == 1
    assert "unknown key 'kernels.graph_floor_us' (renamed 'kernel_gpu_us')" in err


def test_at_most_ten_lines(tmp_path):
    path = tmp_path / "dev.yaml"
    path.write_text("kind: device\n" + "".join(f"extra_{i}: 1\n" for i in range(30)))
    with pytest.raises(SpecError) as err:
        load_hardware_any(str(path))
    lines = str(err.value).splitlines()
    assert len(lines) == MAX_ERRORS and "more errors" in lines[-1]


def test_cli_prints_every_error_once_exit_2_no_traceback(run, tmp_path):
    path = tmp_path / "dev.yaml"
    path.write_text(K80.replace("description:", "descripton:").replace("memory_GiB", "memory_gib"))
    code, out, err = run("show", "hardware", str(path))
    assert code == 2 and out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[0].startswith("planner: ") and 2 <= len(lines) <= MAX_ERRORS
    assert "did you mean 'description'" in err and "did you mean 'memory_GiB'" in err
    code, out, err = run("show", "hardware", str(path), "--format", "json")
    doc = json.loads(out)["error"]
    assert code == 2 and doc["kind"] == "bad_input" and doc["message"].count("\n") == len(lines) - 1
    assert doc["file"] == str(path)


def test_did_you_mean_for_nested_keys(tmp_path):
    path = tmp_path / "sys.yaml"
    path.write_text(_system("k80").replace("count: 1", "cout: 1"))
    with pytest.raises(SpecError, match=r"unknown key 'inter_node.cout' \(did you mean 'count'\?\)"):
        load_system(str(path))


@pytest.mark.parametrize("args, want", [
    (("solve", "-m", "alexnt", "-H", "k80-fdr", "--global-batch", "256"),
     "unknown model 'alexnt' (did you mean 'alexnet'?)"),
    (("solve", "-m", "alexnet", "-H", "k80-fd", "--global-batch", "256"),
     "unknown hardware 'k80-fd' (did you mean 'k80-fdr'?)"),
    (("show", "hardware", "nvswitch-h10"), "(did you mean 'nvswitch-h100'?)"),
    (("show", "model", "resnet5"), "(did you mean 'resnet50'?)"),
])
def test_did_you_mean_for_built_in_names(run, args, want):
    code, _, err = run(*args)
    assert code == 2 and want in err and len(err.strip().splitlines()) == 1


def test_did_you_mean_for_devices_and_links_named_in_a_system(tmp_path):
    path = tmp_path / "sys.yaml"
    path.write_text(_system("h100-sxm5-80g", "fdr-iB"))
    with pytest.raises(SpecError, match=r"unknown device 'h100-sxm5-80g' \(did you mean "
                                        r"'h100-sxm5-80gb'\?\)"):
        load_system(str(path))


def test_no_suggestion_for_a_name_nothing_like_a_built_in():
    with pytest.raises(SpecError) as err:
        load_model("zzzzzz")
    assert "did you mean" not in str(err.value) and "built-in:" in str(err.value)


def test_a_device_as_hardware_says_so_and_names_its_systems(run):
    code, out, err = run("solve", "-m", "alexnet", "-H", "h100-sxm5-80gb", "--global-batch", "256")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "'h100-sxm5-80gb' is a device, not a system" in err and "dgx-h100" in err
    code, _, err = run("evaluate", "-m", "alexnet", "-H", "k80", "--nodes", "1",
                       "--global-batch", "8")
    assert code == 2 and "is a device" in err and "k80-fdr" in err and "aws-p2-8xlarge" in err


def test_a_link_as_hardware_says_so():
    with pytest.raises(SpecError, match="'fdr-ib' is a link, not a system.*k80-fdr"):
        load_system("fdr-ib")


def test_show_hardware_still_takes_devices_and_links():
    assert load_hardware_any("h100-sxm5-80gb").name == "h100-sxm5-80gb"
    assert load_hardware_any("fdr-ib").name == "fdr-ib"


def test_a_yaml_path_is_never_a_built_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match="no such file"):
        load_system("k80-fdr.yaml")
    assert Path("k80-fdr.yaml").exists() is False
