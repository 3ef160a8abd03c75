"""bench/train_bench.py's command line in process: bad --cases and --set are one line and exit 2 before any GPU work
(tests/dist/test_bench_args.py keeps the process's side)."""

import importlib.util

import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def train_bench():
    spec = importlib.util.spec_from_file_location("train_bench", ROOT / "bench" / "train_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "args, says",
    [
        (["--cases", "1.7B:ours", "9B:ours"], "--cases '9B:ours': must be SHAPE:VARIANT"),
        (["--cases", "1.7B"], "--cases '1.7B': must be SHAPE:VARIANT"),
        (["--set", "compile=maybe"], "--set compile: Input should be a valid boolean"),
        (["--set", "no_such_key=1"], "--set no_such_key: Extra inputs are not permitted"),
        (["--set", "master_dtype"], "--set: override 'master_dtype': expected key.sub=value"),
    ],
)
def test_bad_bench_arguments_are_one_line(train_bench, capsys, args, says):
    with pytest.raises(SystemExit) as e:
        train_bench.main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert says in err.strip().splitlines()[-1], err
