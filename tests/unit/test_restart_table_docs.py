"""docs/spares.md's decision table is what scripts/gen_restart_table.py makes of hpc/node/restart_policy.py today."""

import runpy

from conftest import ROOT

GEN = runpy.run_path(str(ROOT / "scripts" / "gen_restart_table.py"))


def test_restart_table_is_current():
    text = (ROOT / "docs" / "spares.md").read_text()
    assert GEN["render"](text) == text, (
        "docs/spares.md's decision table is stale: run python scripts/gen_restart_table.py"
    )


def test_every_kind_has_a_row_saying_what_follows():
    from hpc.node.restart_policy import Kind

    rows = [line for line in GEN["table"]().splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split(" | ")[1] for row in rows] == [str(kind) for kind in Kind]
    then = {row.split(" | ")[1]: row.split(" | ")[2] for row in rows}
    assert then["died"].startswith("restart: ") and "a spare takes its place" in then["died"]
    assert then["error"].startswith("end: ") and then["stopped"].startswith("stop: ")
    stale = GEN["render"]((ROOT / "docs" / "spares.md").read_text().replace("| died |", "| killed |"))
    assert "| killed |" not in stale  # a hand edit is overwritten: the check can fail
