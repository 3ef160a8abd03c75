"""The test tree's own imports (AST): no module of tests/ imports a test module (test_*.py), and a tier's modules
import only the shared helpers (tests/*.py) and their own tier's helpers, never another tier's modules."""

import ast
from pathlib import Path

import pytest
from conftest import ROOT

TIERS = ("unit", "dist", "slurm")


def tree_imports(source: str, tier: str) -> list[str]:
    """The modules of tests/ that ``source`` imports, as tests/-relative dotted names (``unit.test_x``); ``tier`` is
    the importing file's tier ('' at the top of tests/), for relative imports."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = ".".join(p for p in (tier, node.module) if p) if node.level else node.module
            found = [module, *(f"{module}.{a.name}" for a in node.names)]
        else:
            continue
        names += [n.removeprefix("tests.") for n in found if n and n.split(".")[0] in (*TIERS, "tests")]
    return names


def problems(rel: Path, source: str) -> list[str]:
    """Why the module tests/REL, whose text is ``source``, breaks the rule: one line per bad import."""
    tier = rel.parts[0] if len(rel.parts) > 1 else ""
    out = []
    for name in dict.fromkeys(
        ".".join(n.split(".")[:2]) for n in tree_imports(source, tier)
    ):  # a module, not its names
        parts = name.split(".")
        if parts[0] in TIERS and parts[0] != tier:
            out.append(
                f"tests/{rel} imports {name} of the {parts[0]} tier: share it through tests/conftest.py or a "
                "tests/*_helpers.py"
            )
        elif any(p.startswith("test_") for p in parts[1:]):
            out.append(f"tests/{rel} imports the test module {name}: share it through a helpers module")
    return out


def test_no_test_module_imports_a_test_module_or_another_tier():
    tests = ROOT / "tests"
    files = sorted(tests.glob("*.py")) + sorted(p for t in TIERS for p in (tests / t).glob("*.py"))
    assert len(files) > 50
    assert [line for f in files for line in problems(f.relative_to(tests), f.read_text())] == []


@pytest.mark.parametrize(
    "source, bad",
    [
        ("from unit.test_render import render", True),
        ("import dist.test_launch", True),
        ("from slurm import test_cluster", True),
        ("from tests.unit.helpers import x", True),
        ("from .test_health import x", True),
        ("from dist.test_x import y", True),
        ("def f():\n    from unit.test_prepare import cfg", True),
        ("from dist.requeue_checks import x", False),
        ("from .requeue_checks import x", False),
        ("from train_helpers import TINY", False),
        ("from conftest import ROOT", False),
    ],
)
def test_the_rule_finds_each_way_of_importing(source, bad):
    """The check itself, on a module of tests/dist: another tier's module or a test module, however imported, is
    found."""
    assert bool(problems(Path("dist/test_probe.py"), source)) is bad
