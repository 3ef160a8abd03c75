"""The private parts of submitit that hpc/submitter.py builds on, as the installed submitit has them: an upgrade
that renames or reshapes them fails here (pyproject.toml pins the versions tested), not at a user's submission."""

import inspect
import re

import submitit
import tomllib
from conftest import ROOT
from submitit.core import utils

from hpc.submitter import RenderedExecutor


def test_the_overridden_and_called_private_methods_exist_with_their_signatures():
    base = submitit.SlurmExecutor
    assert list(inspect.signature(base._make_submission_file_text).parameters) == ["self", "command", "uid"]
    assert list(inspect.signature(base._submit_command).parameters) == ["self", "command"]
    assert RenderedExecutor._make_submission_file_text is not base._make_submission_file_text  # the override is ours
    # _submit_command writes _make_submission_file_text's text to the file it hands sbatch
    assert "self._make_submission_file_text(command, tmp_uuid)" in inspect.getsource(base._submit_command)
    assert issubclass(utils.FailedJobError, Exception) and issubclass(utils.FailedSubmissionError, Exception)
    assert base._get_job_id_from_submission_command("Submitted batch job 4242") == "4242"


def test_the_installed_submitit_is_in_the_pinned_range():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [pin] = [d for d in deps if d.startswith("submitit")]
    low, high = re.fullmatch(r"submitit>=([\d.]+),<([\d.]+)", pin).groups()
    version = tuple(int(x) for x in submitit.__version__.split(".")[:3])
    assert tuple(int(x) for x in low.split(".")) <= version < tuple(int(x) for x in high.split(".")), (
        submitit.__version__,
        pin,
    )
