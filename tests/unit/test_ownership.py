"""Job isolation: job names map to directories one to one, and a directory belongs to the job that created it."""

import json

import pytest

from hpc.node.ownership import OWNER_FILE, OwnershipError, claim, run_dir_name

NAMES = [
    "模型",
    "数据集",
    "...",
    "exp 1",
    "exp/1",
    "exp:1",
    "exp_1",
    "exp_1-",
    "Exp_1",
    "job",
    "a" * 64,
    "a" * 65,
    "a" * 200,
    "x; touch /tmp/owned $(id)",
    " exp_1",
    "exp_1 ",
]


def test_names_never_share_a_directory():
    dirs = [run_dir_name(n) for n in NAMES]
    assert len(set(dirs)) == len(NAMES), dict(zip(NAMES, dirs, strict=False))
    for d in dirs:
        assert len(d) <= 80 and "/" not in d and not d.startswith(".")
    assert run_dir_name("demo") == "demo" and run_dir_name("exp_1") == "exp_1"  # plain names stay as typed
    assert run_dir_name("exp 1").startswith("exp_1-") and run_dir_name("模型").startswith("job-")


def test_claim_records_the_exact_name_and_refuses_others(tmp_path):
    d = tmp_path / "run"
    claim(d, "exp 1", "checkpoint.dir")
    assert json.loads((d / OWNER_FILE).read_text()) == {"job_name": "exp 1"}
    claim(d, "exp 1", "checkpoint.dir")  # the same job again: fine
    with pytest.raises(
        OwnershipError, match=r"checkpoint.dir .*/run belongs to job 'exp 1' .*; this job is 'exp_1': pick another"
    ):
        claim(d, "exp_1", "checkpoint.dir")


def test_claim_of_an_unwritable_place_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OwnershipError, match=r"log.dir .*/file/sub: cannot use it \(Not a directory\)"):
        claim(tmp_path / "file" / "sub", "a", "log.dir")
