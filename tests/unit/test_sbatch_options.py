"""hpc/sbatch_options.py against independent oracles: the local cluster's recorded ``sbatch --help`` (22.05) and
Python's getopt, which reads long-option prefixes as getopt_long does (exact, unique prefix, else ambiguous)."""

import getopt
import re
from pathlib import Path

import pytest

from hpc.sbatch_options import ALIASES, VERSIONS, accepted_prefixes, check_extra_sbatch, resolve

HELP = Path(__file__).parent / "data" / "sbatch-22.05-help.txt"


def test_help_options_in_the_table():
    listed = set(re.findall(r"--([a-z][a-z0-9-]*)", HELP.read_text()))
    assert len(listed) > 80
    assert listed <= set(VERSIONS["22.05"]), sorted(listed - set(VERSIONS["22.05"]))


def getopt_reads(key: str, options: dict[str, str]):
    """What getopt reads --KEY=x as: the option, or None when it is ambiguous or starts none."""
    try:
        (opt, _), *_ = getopt.getopt([f"--{key}=x"], "", [f"{o}=" for o in options])[0]
    except getopt.GetoptError:
        return None
    return opt[2:]


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_prefixes_as_getopt_reads_them(version):
    options = VERSIONS[version]
    keys = {o[:i] for o in options for i in range(1, len(o) + 1)}
    for key in sorted(keys):
        try:
            ours = resolve(key, options)
        except ValueError:
            ours = None
        theirs = getopt_reads(key, options)
        if theirs is None and ours is not None:  # getopt does not know aliases: tasks starts two names of one option
            assert {ALIASES.get(o, o) for o in options if o.startswith(key)} == {ours}, key
            continue
        assert ours == (ALIASES.get(theirs, theirs) if theirs else None), key
    for option in options:
        for key in accepted_prefixes(ALIASES.get(option, option), options):
            assert resolve(key, options) == ALIASES.get(option, option)


def test_prefix_tables():
    assert "no-k" in accepted_prefixes("no-kill", VERSIONS["22.05"])
    assert "no-" not in accepted_prefixes("no-kill", VERSIONS["22.05"])  # no-kill, no-requeue
    assert "gres-f" in accepted_prefixes("gres-flags", VERSIONS["22.05"])
    assert "tres-b" in accepted_prefixes("tres-bind", VERSIONS["24.11"]) and "tres-bind" not in VERSIONS["22.05"]


@pytest.mark.parametrize(
    "options",
    [{"no-k": "x"}, {"gres-f": "x"}, {"tres-b": "x"}, {"nodef": "x"}, {"export": "NONE"}, {"clusters": "b"},
     {"contiguous": "yes"}, {"constraint": True}, {"exclusive": True, "overs": True}, {"hint": "x", "threads": "1"}],
)  # fmt: skip
def test_refused(options):
    with pytest.raises(ValueError):
        check_extra_sbatch(options)


def test_accepted():
    ok = {"contiguous": True, "exclusive": True, "constraint": "a100", "export": "ALL,X=1", "container-image": "i"}
    assert check_extra_sbatch(ok) == ok
