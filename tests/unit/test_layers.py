"""The layers, read from every module's imports (AST): hpc/node imports nothing else of hpc/, the trainer imports
only hpc.node of hpc/, and neither imports the login side."""
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


def node_side(name: str) -> bool:
    return name == "hpc.node" or name.startswith("hpc.node.")


def project_imports(path: Path) -> set[str]:
    return {n for n in imported(path) if n.split(".")[0] in ("hpc", "train", "bench", "tests")}


@pytest.mark.parametrize("path", modules("hpc/node"), ids=lambda p: str(p.relative_to(ROOT)))
def test_node_side_imports_only_the_node_side(path):
    bad = {n for n in project_imports(path) if not node_side(n)}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}: hpc/node imports nothing else of the project"


@pytest.mark.parametrize("path", modules("train"), ids=lambda p: str(p.relative_to(ROOT)))
def test_trainer_imports_only_the_node_side_of_hpc(path):
    bad = {n for n in project_imports(path) if n.split(".")[0] != "train" and not node_side(n)}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}: the trainer imports only hpc.node of hpc/"


def test_the_checks_see_imports():
    """The reader finds imports anywhere in a module (inside functions too), so the checks above can fail."""
    found = imported(ROOT / "hpc" / "spec.py")
    assert {"train.config", "hpc.slurm_query", "hpc.node.ownership"} <= found
    assert "hpc.node.ownership.claim" in found
