"""The suite's closing table: each tier's wall time (and each slurm test file's) against the budget table in
docs/development.md, then one closing line with the counts of every tier.

    python scripts/tier_times.py DIR      (DIR holds walls: "TIER SECONDS" lines, and TIER.xml: pytest's junit XML)
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_HEADING = "## CI budget"


def budgets(doc: Path = ROOT / "docs" / "development.md") -> dict[str, int]:
    """The budget table under the CI budget heading: ``| part | budget (s) | ...`` rows."""
    text = doc.read_text()
    section = text.split(BUDGET_HEADING, 1)[1].split("\n## ", 1)[0] if BUDGET_HEADING in text else ""
    rows = re.findall(r"^\| *`?([a-z]+)`? *\| *(\d+) *\|", section, flags=re.M)
    return {name: int(seconds) for name, seconds in rows}


def counts(xml: Path) -> tuple[dict[str, int], dict[str, float]]:
    """(passed/failed/skipped counts, seconds per test file) from one junit XML file."""
    n = {"passed": 0, "failed": 0, "skipped": 0}
    per_file: dict[str, float] = defaultdict(float)
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        n["failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"] += 1
        parts = (case.get("classname") or "").split(".")  # the module's dotted path, then a Test class if any
        module = parts[:-1] if parts[-1].startswith("Test") else parts
        per_file["/".join(module) + ".py"] += float(case.get("time") or 0)
    return n, per_file


def main(folder: str) -> int:
    here = Path(folder)
    walls = {}
    for line in (here / "walls").read_text().splitlines() if (here / "walls").exists() else []:
        name, seconds = line.split()
        walls[name] = int(seconds)
    budget = budgets()
    total = defaultdict(int)
    print(f"[ci] {'part':<8} {'wall s':>7} {'budget s':>9}  tests")
    slurm_files: dict[str, float] = {}
    for name, seconds in walls.items():
        xml = here / f"{name}.xml"
        n, per_file = counts(xml) if xml.exists() else ({}, {})
        for k, v in n.items():
            total[k] += v
        if name == "slurm":
            slurm_files = per_file
        over = " OVER" if name in budget and seconds > budget[name] else ""
        tests = ", ".join(f"{v} {k}" for k, v in n.items() if v) or "-"
        print(f"[ci] {name:<8} {seconds:>7} {budget.get(name, '-'):>9}  {tests}{over}")
    whole = sum(walls.values())
    print(f"[ci] {'total':<8} {whole:>7} {budget.get('total', '-'):>9}")
    for path, seconds in sorted(slurm_files.items(), key=lambda kv: -kv[1]):
        print(f"[ci]   {path:<44} {seconds:>6.0f} s (the sum of its tests)")
    print(f"tests: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
