"""--nodelist / --exclude: Slurm hostlists checked before anything is submitted, rendered into the #SBATCH header."""

import hostlist
import pytest

from hpc.preflight import main as preflight_main
from hpc.render import directives
from hpc.site import load_site
from hpc.spec import SpecError, build_spec
from hpc.submit import main


def spec(**kw):
    return build_spec(load_site("local"), nodes=kw.pop("nodes", 2), **kw)


def test_hostlists_are_compressed_into_the_header():
    d = directives(spec(nodelist="n2,n1", exclude="gpu-a[07-08],gpu-a09,n4"))
    assert d["nodelist"] == "n[1-2]" and d["exclude"] == "gpu-a[07-09],n4"
    assert hostlist.expand_hostlist(d["exclude"]) == ["gpu-a07", "gpu-a08", "gpu-a09", "n4"]  # Slurm's reading of it
    assert "nodelist" not in directives(spec()) and "exclude" not in directives(spec())


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(exclude="n[1-"), "--exclude 'n[1-': not a Slurm hostlist (unbalanced brackets); e.g. n[1-3],gpu07"),
        (dict(exclude="n[3-1]"), "--exclude 'n[3-1]': not a Slurm hostlist (start > stop); e.g. n[1-3],gpu07"),
        (
            dict(nodelist="n1;touch x"),
            "--nodelist 'n1;touch x': 'n1;touch x' is not a node name (letters, digits, '.', '_' and '-')",
        ),
        (dict(exclude=""), "--exclude '': names no node; e.g. n[1-3],gpu07"),
        (dict(nodelist="n[1-3]"), "--nodelist 'n[1-3]' names 3 nodes; --nodes 2: list at most --nodes nodes"),
        (
            dict(nodelist="n[1-2]", exclude="n[2-4]"),
            "--nodelist and --exclude both name n2: a node is either wanted or excluded",
        ),
    ],
)
def test_bad_hostlists_name_the_flag(kw, message):
    with pytest.raises(SpecError) as e:
        spec(**kw)
    assert str(e.value) == message


@pytest.mark.parametrize("prog, command", [("hpc.submit", main), ("hpc.preflight", preflight_main)])
def test_both_commands_refuse_a_bad_list_in_one_line(prog, command, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        command(
            [
                "--site",
                "local",
                "--nodes",
                "1",
                "--exclude",
                "n[1-",
                "--out" if prog == "hpc.preflight" else "--dry-run",
                *([str(tmp_path / "out")] if prog == "hpc.preflight" else []),
            ]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == f"{prog}: error: --exclude 'n[1-': not a Slurm hostlist (unbalanced brackets); e.g. n[1-3],gpu07\n"
    assert not (tmp_path / "out").exists()
