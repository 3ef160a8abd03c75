"""The survey covers what a user can give: every profile key (hpc/site.py's models) has an error case naming it, and
every long flag of hpc.submit, hpc.jobs, hpc.plan and hpc.preflight appears in an error case of its command. A new
key or flag without a case fails here."""

import argparse
import importlib

import pytest
from bad_input_cases import all_cases, profile_keys

ERRORS = [c for c in all_cases() if c.expect == "error"]
COMMANDS = ("hpc.submit", "hpc.jobs", "hpc.plan", "hpc.preflight")


def long_flags(p: argparse.ArgumentParser) -> set[str]:
    out = set()
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= long_flags(sub)
        out |= {o for o in action.option_strings if o.startswith("--") and o != "--help"}
    return out


def test_every_profile_key_has_a_case():
    keys = profile_keys()
    assert len(keys) > 50
    missing = [k for k in keys if not any(k.rsplit(".", 1)[-1] in (c.names or "") for c in ERRORS)]
    assert not missing, f"profile keys without a bad-input case: {missing}"


@pytest.mark.parametrize("cli", COMMANDS)
def test_every_flag_has_a_case(cli):
    flags = long_flags(importlib.import_module(cli).parser())
    assert flags
    missing = sorted(f for f in flags if not any(c.cli == cli and f in c.argv for c in ERRORS))
    assert not missing, f"{cli} flags without a bad-input case: {missing}"
