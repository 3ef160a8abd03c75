"""Rendered sbatch scripts under bash: every rendering parses, a hostile job name stays one word."""
import shlex
import subprocess

import pytest

from hpc.node.ownership import run_dir_name
from login_helpers import HOSTILE, SITES, TEST_SITES, render


@pytest.mark.parametrize("site", SITES + TEST_SITES)
def test_bash_parses_every_rendering(site, monkeypatch, tmp_path):
    for kw in ({}, {"launcher": "torchrun"}, {"launcher": "accelerate"}, {"job_name": HOSTILE}, {"args": ["-m", "hpc.node.smoke", "--out", "/a b/$(x)"]}):
        f = tmp_path / "job.sbatch"
        f.write_text(render(site, monkeypatch, **dict(kw)))
        r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_hostile_job_name_stays_one_quoted_word(monkeypatch):
    text = render("local", monkeypatch, job_name=HOSTILE)
    line = next(l for l in text.splitlines() if l.startswith("#SBATCH --job-name="))
    assert shlex.split(line.removeprefix("#SBATCH --job-name=")) == [HOSTILE]
    # outside the quoted directive it appears only in a comment, one quoted export and as a directory name
    export = next(l for l in text.splitlines() if l.startswith("export HPC_JOB_NAME="))
    r = subprocess.run(["bash", "-c", f'{export}; printf %s "$HPC_JOB_NAME"'], capture_output=True, text=True)
    assert r.stdout == HOSTILE
    executable = [l for l in text.splitlines() if l and not l.startswith("#") and l != export]
    assert not any("touch /tmp" in l or "$(id)" in l for l in executable)
    assert f"/jobs/{run_dir_name(HOSTILE)}/%j_0_log.out" in text
    assert run_dir_name(HOSTILE).startswith("x_touch_tmp_owned_id_id_q_HOME-")
