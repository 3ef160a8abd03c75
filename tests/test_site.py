"""Site profiles: the shipped ones validate; mistakes name the file, the key and what is allowed."""
from pathlib import Path

import pytest
import yaml

from hpc.site import PROJECT_SITE_DIR, SiteError, load_site
from hpc.slurm_time import format_minutes, parse_minutes

SHIPPED = sorted(p.stem for p in PROJECT_SITE_DIR.glob("*.yaml"))


def test_shipped_profiles():
    assert {"local", "ib-h200", "roce-h100", "eth-a100"} <= set(SHIPPED)
    fabrics = {load_site(n).network.fabric for n in SHIPPED}
    assert {"infiniband", "roce", "ethernet"} <= fabrics


@pytest.mark.parametrize("name", SHIPPED)
def test_each_profile_loads_and_has_a_default_partition(name):
    site = load_site(name)
    assert site.name == name
    assert site.partition(None).gpus_per_node >= 1


def write(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load((PROJECT_SITE_DIR / "ib-h200.yaml").read_text())
    mutate(data)
    path = tmp_path / "mysite.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_unknown_key_is_an_error_naming_file_and_key(tmp_path):
    path = write(tmp_path, lambda d: d["network"].update(nccl_socket_ifnam="ib0"))
    with pytest.raises(SiteError) as e:
        load_site(str(path))
    assert str(e.value) == f"{path}: network.nccl_socket_ifnam: unknown key (check the spelling; see site_configs/README.md for the keys)"


def test_bad_value_says_what_is_allowed(tmp_path):
    path = write(tmp_path, lambda d: d["network"].update(gdr_level="FAST"))
    with pytest.raises(SiteError, match=r"mysite.yaml: network.gdr_level: Input should be 'LOC', 'PIX', 'PXB', 'PHB' or 'SYS'"):
        load_site(str(path))
    path = write(tmp_path, lambda d: d["partitions"][0].update(max_time="two days"))
    with pytest.raises(SiteError, match=r"partitions.0.max_time: time 'two days' is not a Slurm time; allowed forms"):
        load_site(str(path))
    path = write(tmp_path, lambda d: d["partitions"][0].update(gpus_per_node=0))
    with pytest.raises(SiteError, match=r"partitions.0.gpus_per_node: Input should be greater than or equal to 1"):
        load_site(str(path))


def test_roce_needs_gid_index(tmp_path):
    path = write(tmp_path, lambda d: d["network"].update(fabric="roce"))
    with pytest.raises(SiteError, match="network: fabric roce needs roce_gid_index"):
        load_site(str(path))


def test_missing_required_key(tmp_path):
    path = write(tmp_path, lambda d: d.pop("network"))
    with pytest.raises(SiteError, match=r"mysite.yaml: network: Field required"):
        load_site(str(path))


def test_invalid_yaml_names_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\npartitions: [\n")
    with pytest.raises(SiteError, match=r"broken.yaml line \d+: not valid YAML"):
        load_site(str(path))


def test_lookup_order_user_dirs_first(tmp_path, monkeypatch):
    mine = tmp_path / "sites"
    mine.mkdir()
    data = yaml.safe_load((PROJECT_SITE_DIR / "local.yaml").read_text())
    data["description"] = "my override"
    (mine / "local.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("HPC_SITE_DIRS", str(mine))
    assert load_site("local").description == "my override"
    monkeypatch.delenv("HPC_SITE_DIRS")
    assert load_site("local").description != "my override"


def test_unknown_site_lists_known_ones():
    with pytest.raises(SiteError, match=r"site 'nosuch' not found in .*known sites: .*ib-h200.*local"):
        load_site("nosuch")


def test_unknown_partition():
    with pytest.raises(SiteError, match="partition 'gpu' is not in the profile; allowed: debug, low, high"):
        load_site("local").partition("gpu")


@pytest.mark.parametrize("text,minutes", [("30", 30), ("1:30", 2), ("02:00:00", 120), ("1-00", 1440),
                                          ("1-02:03", 1563), ("2-00:00:00", 2880), ("UNLIMITED", None)])
def test_slurm_times(text, minutes):
    assert parse_minutes(text) == minutes


def test_bad_times():
    for bad in ("", "1h", "0", "-1", "1:2:3:4"):
        with pytest.raises(ValueError, match="allowed forms|longer than zero"):
            parse_minutes(bad)
    assert format_minutes(1563) == "1-02:03:00" and format_minutes(90) == "01:30:00"
