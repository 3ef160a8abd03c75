"""A libfabric fabric checked by hpc.node.launch before the ranks start: a fake `fi_info` first on PATH answers with
the outputs recorded in tests/unit/data/fi_info (AWS's and HPE's documentation, this machine's libfabric), and an NCCL
net plugin built here (a library exporting ncclNetPlugin_v8) is loaded by path and by NCCL's suffix name."""

import os
import shutil
import subprocess

import pytest
from conftest import PYTHON, ROOT, slurm_task_env

FI_INFO = ROOT / "tests" / "unit" / "data" / "fi_info"


def fake_fi_info(folder, out, rc=0, err=None):
    """`fi_info` answering with a recorded stdout (and stderr, exit code)."""
    folder.mkdir(exist_ok=True)
    tool = folder / "fi_info"
    tool.write_text(f"#!/bin/bash\ncat {out}\n{f'cat {err} >&2' if err else ''}\nexit {rc}\n")
    tool.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def launch(**env):
    return subprocess.run(
        [PYTHON, "-m", "hpc.node.launch", "--", PYTHON, "-c", "print('ran')"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=slurm_task_env(**env),
    )


@pytest.mark.parametrize(
    "fabric,provider,record,domains",
    [
        ("efa", "efa", "efa-p4d.out", "efa_0-rdm, efa_1-rdm, efa_2-rdm, efa_3-rdm"),
        ("slingshot", "cxi", "cxi.out", "cxi0"),
    ],
)
def test_the_provider_is_listed_or_the_node_is_named(tmp_path, fabric, provider, record, domains):
    r = launch(FI_PROVIDER=provider, **fake_fi_info(tmp_path / "ok", FI_INFO / record))
    assert r.returncode == 0 and "ran" in r.stdout, r.stderr
    assert f"libfabric {provider}: {domains}" in r.stdout
    missing = fake_fi_info(
        tmp_path / "missing", "/dev/null", int((FI_INFO / "missing.rc").read_text()), FI_INFO / "missing.err"
    )
    r = launch(FI_PROVIDER=provider, **missing)
    assert r.returncode == 2 and "ran" not in r.stdout
    assert r.stderr == (
        f"hpc.node.launch: error: here: FI_PROVIDER={provider} but fi_info -p {provider} lists no {provider} device "
        f"on this node (fi_getinfo: -61): its driver or libfabric's {provider} provider is missing here\n"
    )
    (tmp_path / "empty").mkdir()
    r = launch(
        FI_PROVIDER=provider, PATH=str(tmp_path / "empty")
    )  # no fi_info at all (the rank's python is a full path)
    assert (
        r.returncode == 2
        and "fi_info (libfabric's tool) is not on PATH on this node" in r.stderr
        and r.stderr.count("\n") == 1
    )


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """libnccl-net-fake.so: the symbol NCCL looks for in a net plugin, nothing more."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) to build the test's NCCL net plugin: apt-get install gcc")
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "p.c").write_text('struct { const char *name; } ncclNetPlugin_v8 = { "AWS Libfabric" };\n')
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(folder / "libnccl-net-fake.so"), str(folder / "p.c")], check=True)
    return folder


def test_the_plugin_loads_by_path_and_by_name(plugin):
    r = launch(NCCL_NET="AWS Libfabric", NCCL_NET_PLUGIN=str(plugin / "libnccl-net-fake.so"))
    assert r.returncode == 0 and f"nccl net plugin {plugin}/libnccl-net-fake.so (ncclNetPlugin_v8)" in r.stdout, (
        r.stderr
    )
    r = launch(
        NCCL_NET="AWS Libfabric", NCCL_NET_PLUGIN="fake", LD_LIBRARY_PATH=str(plugin)
    )  # NCCL's libnccl-net-fake.so
    assert r.returncode == 0 and "nccl net plugin libnccl-net-fake.so (ncclNetPlugin_v8)" in r.stdout, r.stderr
    r = launch(NCCL_NET="AWS Libfabric", NCCL_NET_PLUGIN="fake")  # not on the library path
    assert r.returncode == 2 and "ran" not in r.stdout and r.stderr.count("\n") == 1
    assert (
        "NCCL_NET_PLUGIN=fake, but the NCCL net plugin does not load on this node (fake: cannot open shared object file"
        in r.stderr
    )


def test_a_node_with_another_torch_fails_in_its_first_seconds():
    """The batch script exports the versions the login node rendered for; hpc.node.launch compares before any rank."""
    r = launch(HPC_EXPECT_TORCH="1.0.0+cu0")
    assert r.returncode == 2 and "ran" not in r.stdout and r.stderr.count("\n") == 1
    assert (
        r.stderr.startswith("hpc.node.launch: error: here: this node runs torch ")
        and "(rendered for 1.0.0+cu0)" in r.stderr
    )


def test_a_plugin_older_than_the_presets_minimum_stops_the_node(plugin, tmp_path):
    """HPC_FABRIC_MIN (the preset for a current plugin and libfabric): a plugin library whose compiled-in
    "aws-ofi-nccl X.Y.Z" is older is named in one line before any rank starts; libfabric comes from fi_info
    --version."""
    cc = shutil.which("cc") or shutil.which("gcc")
    src = tmp_path / "old.c"
    src.write_text(
        'struct { const char *name; } ncclNetPlugin_v8 = { "AWS Libfabric" };\n'
        'const char package_string[] = "Initializing aws-ofi-nccl 1.6.0-aws";\n'
    )
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libnccl-net-old.so"), str(src)], check=True)
    fi_info = fake_fi_info(tmp_path / "bin", FI_INFO / "version-efa.out")
    env = dict(NCCL_NET="AWS Libfabric", HPC_FABRIC_MIN="aws-ofi-nccl=1.7,libfabric=1.18", **fi_info)
    r = launch(NCCL_NET_PLUGIN=str(tmp_path / "libnccl-net-old.so"), **env)
    assert r.returncode == 2 and "ran" not in r.stdout and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("hpc.node.launch: error: here: aws-ofi-nccl 1.6.0 is older than 1.7 on this node:"), (
        r.stderr
    )
    r = launch(NCCL_NET_PLUGIN="old", LD_LIBRARY_PATH=str(tmp_path), **env)  # NCCL's libnccl-net-old.so, found so too
    assert r.returncode == 2 and "aws-ofi-nccl 1.6.0 is older than 1.7" in r.stderr, r.stderr
    r = launch(NCCL_NET_PLUGIN=str(plugin / "libnccl-net-fake.so"), **env)  # no version string: unknown, not refused
    assert r.returncode == 0 and "versions aws-ofi-nccl unknown, libfabric 1.22.0, nccl " in r.stdout, r.stderr
