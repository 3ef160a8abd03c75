"""Site profiles: the shipped ones validate; mistakes name the file, the key and what is allowed."""

from pathlib import Path

import pytest
import yaml

from hpc.site import SHIPPED_SITE_DIR, SiteError, load_site
from hpc.slurm_time import format_minutes, parse_minutes

SHIPPED = sorted(p.stem for p in SHIPPED_SITE_DIR.glob("*.yaml"))


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
    data = yaml.safe_load((SHIPPED_SITE_DIR / "ib-h200.yaml").read_text())
    mutate(data)
    path = tmp_path / "mysite.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_unknown_key_is_an_error_naming_file_and_key(tmp_path):
    path = write(tmp_path, lambda d: d["network"].update(nccl_socket_ifnam="ib0"))
    with pytest.raises(SiteError) as e:
        load_site(str(path))
    assert (
        str(e.value)
        == f"{path}: network.nccl_socket_ifnam: unknown key (check the spelling; see docs/sites.md for the keys)"
    )


def test_bad_value_says_what_is_allowed(tmp_path):
    path = write(tmp_path, lambda d: d["network"].update(gdr_level="FAST"))
    with pytest.raises(
        SiteError, match=r"mysite.yaml: network.gdr_level: Input should be 'LOC', 'PIX', 'PXB', 'PHB' or 'SYS'"
    ):
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
    data = yaml.safe_load((SHIPPED_SITE_DIR / "local.yaml").read_text())
    data["description"] = "my override"
    (mine / "local.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("HPC_SITE_DIRS", str(mine))
    assert load_site("local").description == "my override"
    monkeypatch.delenv("HPC_SITE_DIRS")
    assert load_site("local").description != "my override"


def test_search_path_order(tmp_path, monkeypatch):
    """$HPC_SITE_DIRS, then the working directory, then $XDG_CONFIG_HOME/hpc/sites, then the shipped profile."""
    base = yaml.safe_load((SHIPPED_SITE_DIR / "local.yaml").read_text())
    places = {"env": tmp_path / "env", "cwd": tmp_path / "cwd", "user": tmp_path / "xdg" / "hpc" / "sites"}
    for where, d in places.items():
        d.mkdir(parents=True)
        (d / "local.yaml").write_text(yaml.safe_dump({**base, "description": where}))
    monkeypatch.setenv("HPC_SITE_DIRS", f"{tmp_path / 'empty'}:{places['env']}")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(places["cwd"])
    found = []
    for where in ("env", "cwd", "user"):
        found.append(load_site("local").description)
        (places[where] / "local.yaml").unlink()
    found.append(load_site("local").description)
    assert found == ["env", "cwd", "user", base["description"]]


def test_unknown_site_lists_known_ones():
    with pytest.raises(SiteError, match=r"site 'nosuch' not found in .*known sites: .*ib-h200.*local"):
        load_site("nosuch")


def test_unknown_partition():
    with pytest.raises(SiteError, match="partition 'gpu' is not in the profile; allowed: debug, low, high"):
        load_site("local").partition("gpu")


@pytest.mark.parametrize(
    "text,minutes",
    [
        ("30", 30),
        ("1:30", 2),
        ("02:00:00", 120),
        ("1-00", 1440),
        ("1-02:03", 1563),
        ("2-00:00:00", 2880),
        ("UNLIMITED", None),
    ],
)
def test_slurm_times(text, minutes):
    assert parse_minutes(text) == minutes


def test_bad_times():
    for bad in ("", "1h", "0", "-1", "1:2:3:4"):
        with pytest.raises(ValueError, match="allowed forms|longer than zero"):
            parse_minutes(bad)
    assert format_minutes(1563) == "1-02:03:00" and format_minutes(90) == "01:30:00"


@pytest.mark.parametrize(
    "mutate,message",
    [
        (
            lambda d: d["network"]["extra_env"].update({"X; touch canary #": "1"}),
            "network.extra_env: 'X; touch canary #' is not a shell variable name",
        ),
        (
            lambda d: d["submission"].update(extra_sbatch={"constraint\nrm -rf /": "x"}),
            "submission.extra_sbatch: 'constraint\\nrm -rf /' is not an sbatch long option",
        ),
        (lambda d: d["submission"].update(extra_sbatch={"--constraint": "x"}), "is not an sbatch long option"),
        (
            lambda d: d["submission"].update(extra_sbatch={"nodes": "8"}),
            "submission.extra_sbatch: 'nodes' is set by hpc.submit",
        ),
        (lambda d: d["submission"].update(extra_sbatch={"job-name": "x"}), "'job-name' is set by hpc.submit"),
        (
            lambda d: d["submission"].update(extra_sbatch={"constraint": "h200\necho owned"}),
            "the value of 'constraint' must be one line",
        ),
        (
            lambda d: d["submission"].update(account="acct\necho owned"),
            "submission.account: String should match pattern",
        ),
        (
            lambda d: d["network"].update(ib_hca=["mlx5_0", "^mlx5_1"]),
            "network.ib_hca: an item starting with ^ is not an exclude list here",
        ),
        (lambda d: d["network"].update(ib_hca=["mlx5_0", "=mlx5_1"]), "= (exact names) applies to the whole list"),
        (lambda d: d["network"].update(ib_hca=["mlx5 0"]), "network.ib_hca: NCCL_IB_HCA='mlx5 0' is not an NCCL list"),
        (
            lambda d: d["network"].update(nccl_socket_ifname="ib0,^eth"),
            "network.nccl_socket_ifname: NCCL_SOCKET_IFNAME='ib0,^eth' is not an NCCL list",
        ),
        (
            lambda d: d["network"].update(gloo_socket_ifname="^ib0"),
            "network.gloo_socket_ifname: '^ib0' is not a comma list of interface names",
        ),
    ],
)
def test_keys_that_reach_the_shell_are_validated_at_load(tmp_path, mutate, message):
    path = write(tmp_path, mutate)
    with pytest.raises(SiteError) as e:
        load_site(str(path))
    assert message in str(e.value) and "\n" not in str(e.value).replace("\\n", "")


def test_exact_hca_list_loads(tmp_path):
    site = load_site(str(write(tmp_path, lambda d: d["network"].update(ib_hca=["=mlx5_0", "mlx5_1"]))))
    assert site.network.ib_hca == ["=mlx5_0", "mlx5_1"]


def test_unreadable_profiles_are_one_line(tmp_path):
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00name: x\n")
    with pytest.raises(SiteError, match=r"bin.yaml: not a text file \(not UTF-8 at byte 0\)"):
        load_site(str(binary))
    with pytest.raises(SiteError, match="is a directory"):
        load_site(str(tmp_path) + "/")
