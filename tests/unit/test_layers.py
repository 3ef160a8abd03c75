"""The floors, read from every module's imports (AST): hpc/node (the node side) imports nothing else of the project;
train/front (the trainer's front door) only the node side; train/ (the trainer) and hpc/integrations (users' own
scripts) only the node side and the front door besides themselves; only the login side (the modules directly in hpc/)
may import the trainer, through its front door, and nothing imports the login side. The front door and the login side
import no torch, transformers or numpy (tests/dist/test_login_imports.py checks the same in a process)."""

import ast
from pathlib import Path

import pytest
from conftest import ROOT


def script_block(node: ast.AST) -> bool:
    """``if __name__ == "__main__":``: it runs only with the file as a script (``python -m``), as module __main__."""
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def imported(path: Path, scripts: bool = True) -> set[str]:
    """Every module a file imports (absolute names; relative imports resolved against its package); without the
    ``__main__`` block's imports when ``scripts`` is false."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = set()
    tree = ast.parse(path.read_text(), str(path))
    if not scripts:
        tree.body = [node for node in tree.body if not script_block(node)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def floor(name: str) -> str | None:
    """hpc.node, hpc.integrations, train.front, train or hpc (the login side) for a module of the project; None for
    anything else."""
    parts = name.split(".")
    if parts[0] == "train":
        return "train.front" if parts[1:2] == ["front"] else "train"
    if parts[0] != "hpc":
        return None
    return f"hpc.{parts[1]}" if len(parts) > 1 and parts[1] in ("node", "integrations") else "hpc"


def project_imports(path: Path) -> set[str]:
    return {n for n in imported(path) if n.split(".")[0] in ("hpc", "train", "bench", "tests")}


ALLOWED = {
    "hpc/node": {"hpc.node"},
    "train/front": {"train.front", "hpc.node"},
    "train": {"train", "train.front", "hpc.node"},
    "hpc/integrations": {"hpc.integrations", "hpc.node"},
}
HEAVY = ("torch", "transformers", "numpy")  # what the login side never imports
TORCH_FREE = [*modules("train/front"), *sorted((ROOT / "hpc").glob("*.py"))]  # the front door and the login side


def folder_of(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    return "train/front" if parts[:2] == ("train", "front") else "train" if parts[0] == "train" else "/".join(parts[:2])


@pytest.mark.parametrize(
    "path", sorted({p for folder in ALLOWED for p in modules(folder)}), ids=lambda p: str(p.relative_to(ROOT))
)
def test_each_floor_imports_only_the_floors_below_it(path):
    folder = folder_of(path)
    bad = {n for n in project_imports(path) if floor(n) not in ALLOWED[folder]}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}: {folder} imports only {sorted(ALLOWED[folder])}"


@pytest.mark.parametrize("path", TORCH_FREE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_front_door_and_the_login_side_import_no_torch(path):
    heavy = sorted(n for n in imported(path) if n.split(".")[0] in HEAVY)
    assert not heavy, f"{path.relative_to(ROOT)} imports {heavy}: the login side reads it without {', '.join(HEAVY)}"


@pytest.mark.parametrize("path", sorted((ROOT / "hpc").glob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_login_side_reads_the_trainer_through_its_front_door(path):
    trainer = sorted(n for n in project_imports(path) if floor(n) == "train")
    assert not trainer, f"{path.relative_to(ROOT)} imports {trainer}: the login side reads the trainer in train/front/"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (``from a import b`` names module a.b where there is one), leaving
    out the ``__main__`` blocks: run as a script, a module is __main__, not the module its importers import."""
    names = {module_name(p): p for folder in ("hpc", "train") for p in modules(folder)}
    graph = {}
    for name, path in names.items():
        graph[name] = set()
        for imported_name in imported(path, scripts=False):
            while imported_name and imported_name not in names:
                imported_name = imported_name.rpartition(".")[0]
            if imported_name and imported_name != name:
                graph[name].add(imported_name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, found = {}, {}, [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    """No two modules of hpc/ and train/ import each other, even through others, type-checking imports included."""
    assert cycles(import_graph()) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail


def test_the_top_level_holds_the_designs_folders():
    """The design's shape: hpc/ is the login side with the node side and the integrations inside it, train/ the
    trainer, sbatch_templates/ the job templates and site_configs/ the shipped profiles."""
    top = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
    assert {"pyproject.toml", "README.md", "hpc", "sbatch_templates", "train", "tests", "site_configs"} <= top
    assert sorted(p.name for p in (ROOT / "hpc").iterdir() if p.is_dir() and p.name != "__pycache__") == [
        "integrations",
        "node",
    ]
    assert {p.name for p in (ROOT / "sbatch_templates").iterdir()} == {"job.sbatch.j2", "preamble.sh.j2"}
    assert "local.yaml" in {p.name for p in (ROOT / "site_configs").iterdir()}
    assert (ROOT / "train" / "__main__.py").is_file()


def test_the_checks_see_imports():
    """The reader finds imports anywhere in a module (inside functions too), so the checks above can fail."""
    found = imported(ROOT / "hpc" / "spec.py")
    assert {"train.front.config", "hostlist", "hpc.node.ownership"} <= found  # hostlist: inside parse_nodes
    assert "hpc.node.ownership.check_owner" in found
    assert {"transformers.AutoTokenizer", "transformers"} <= imported(ROOT / "train" / "data" / "tokenizer.py")
    assert len(TORCH_FREE) > 20 and (ROOT / "train" / "front" / "tokenizer.py") in TORCH_FREE
