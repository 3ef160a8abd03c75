"""The floors, read from every module's imports (AST): hpc/node (the node side) imports nothing else of the project;
hpc/train (the trainer) and hpc/integrations (users' own scripts) import only the node side besides themselves; only
hpc/login (the login side) may import the trainer, and nothing imports the login side."""
import ast
from pathlib import Path

import pytest

from conftest import ROOT


def imported(path: Path) -> set[str]:
    """Every module a file imports (absolute names; relative imports resolved against its package)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def floor(name: str) -> str | None:
    """hpc.node, hpc.train, hpc.integrations or hpc.login for a module of the project; None for anything else."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "hpc" and len(parts) > 1 else None


def project_imports(path: Path) -> set[str]:
    return {n for n in imported(path) if n.split(".")[0] in ("hpc", "bench", "tests")}


ALLOWED = {"hpc/node": {"hpc.node"}, "hpc/train": {"hpc.train", "hpc.node"},
           "hpc/integrations": {"hpc.integrations", "hpc.node"}}


@pytest.mark.parametrize("path", [p for folder in ALLOWED for p in modules(folder)], ids=lambda p: str(p.relative_to(ROOT)))
def test_each_floor_imports_only_the_floors_below_it(path):
    folder = "/".join(path.relative_to(ROOT).parts[:2])
    bad = {n for n in project_imports(path) if floor(n) not in ALLOWED[folder]}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}: {folder} imports only {sorted(ALLOWED[folder])}"


def test_the_package_holds_the_floors_and_nothing_else():
    assert sorted(p.name for p in (ROOT / "hpc").iterdir() if p.is_dir() and p.name != "__pycache__") == \
        ["integrations", "login", "node", "train"]
    assert {p.name for p in (ROOT / "hpc").glob("*.py")} == {"__init__.py"}


def test_the_checks_see_imports():
    """The reader finds imports anywhere in a module (inside functions too), so the checks above can fail."""
    found = imported(ROOT / "hpc" / "login" / "spec.py")
    assert {"hpc.train.config", "hpc.login.slurm_query", "hpc.node.ownership"} <= found
    assert "hpc.node.ownership.claim" in found
