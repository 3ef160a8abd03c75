"""One choke point per class, kept so by reading the sources (ast over hpc/ and train/): a file is read through
hpc/node/files.py (a regular file, opened without blocking, fstat before the read, to a bound), a short-lived tool runs
through hpc/node/tool.py (bounded output, a timeout, lenient decoding). Any other read or subprocess call fails this
test unless it is one of the exceptions below, each with its reason."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READS = {"open", "read_text", "read_bytes"}
PROCS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}
CHOKE_POINTS = {"hpc/node/files.py", "hpc/node/tool.py"}
DATA = "train/front/data_sources.py"
EXCEPTIONS = {  # (file, function, call): why
    ("hpc/node/launch.py", "run_wrapped", "subprocess.Popen"): "the rank program, supervised for its whole run",
    ("hpc/node/launch.py", "run_noticed", "subprocess.Popen"): "the rank program, supervised for its whole run",
    ("hpc/node/launch.py", "supervise", "subprocess.Popen"): "the rank program, supervised for its whole run",
    ("hpc/node/restart.py", "_attempt", "subprocess.Popen"): "the ranks' srun, supervised for its whole run",
    (
        "hpc/node/restart.py",
        "_watch_batch_host",
        "subprocess.Popen",
    ): "the batch host's watch, a step for the whole run",
    ("hpc/node/restart.py", "_start_standby", "subprocess.Popen"): "the nodes' standby, a step for the whole run",
    ("hpc/node/launch.py", "catches", "read_text"): "/proc/PID/stat and status: the kernel's, a page at most",
    ("hpc/node/netcheck.py", "_ipv6_addrs", "read_text"): "/proc/net/if_inet6: the kernel's",
    ("hpc/node/netcheck.py", "_read", "read_text"): "/sys/class/net/IFACE/*: the kernel's, a page at most",
    ("train/checkpoint.py", "_crc32", "open"): "the trainer's checkpoint shards, streamed in chunks to checksum them",
    (DATA, "_jsonl_records", "open"): "data.path, streamed line by line (a data set is as large as it is; checked to "
    "be a regular file before)",
    (DATA, "__str__", "open"): "data.path's line count for an error message, streamed",
    (DATA, "records", "read_text"): "data.path's JSON array, read once as the data set",
    ("train/metrics.py", "_keep_until", "read_text"): "the run's own metrics.jsonl, cut at the resumed step",
    ("train/tracking.py", "wandb_records", "read_bytes"): "the run's own offline wandb file, for the tests' check",
}


def calls(path: Path):
    """(function, call) of every file read and subprocess call in ``path`` (writes, by their mode, left out)."""
    tree = ast.parse(path.read_text())
    owner: dict[int, str] = {}

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            owner[id(child)] = name
            visit(child, name)

    visit(tree, "<module>")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f, what, mode_at = node.func, None, None
        if isinstance(f, ast.Name) and f.id == "open":
            what, mode_at = "open", 1
        elif isinstance(f, ast.Attribute):
            base = f.value.id if isinstance(f.value, ast.Name) else None
            if f.attr in READS and base not in ("os", "tarfile", "zipfile"):
                what, mode_at = f.attr, 0 if f.attr == "open" else None
            elif base == "json" and f.attr == "load":
                what = "json.load"
            elif base == "subprocess" and f.attr in PROCS:
                what = f"subprocess.{f.attr}"
            elif base == "os" and (f.attr in ("system", "popen") or f.attr.startswith(("exec", "spawn"))):
                what = f"os.{f.attr}"
        if what is None:
            continue
        mode = node.args[mode_at] if mode_at is not None and len(node.args) > mode_at else None
        mode = mode or next((k.value for k in node.keywords if k.arg == "mode"), None)
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax"):
            continue  # a write
        yield owner.get(id(node), "<module>"), what


def test_reads_and_tools_go_through_their_choke_points():
    found, used = [], set()
    for root in ("hpc", "train"):
        for path in sorted((ROOT / root).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in CHOKE_POINTS:
                continue
            for func, what in calls(path):
                key = (rel, func, what)
                if key in EXCEPTIONS:
                    used.add(key)
                else:
                    found.append(f"{rel}: {func}: {what}")
    assert not found, "read or run outside hpc/node/files.py and hpc/node/tool.py:\n" + "\n".join(found)
    assert used == set(EXCEPTIONS), f"exceptions no longer needed: {sorted(set(EXCEPTIONS) - used)}"


def test_the_scan_sees_what_it_must(tmp_path):
    """The scan itself: each kind of read and call is found, a write is not."""
    src = tmp_path / "m.py"
    src.write_text(
        "import json, os, subprocess\n"
        "def f(p):\n"
        "    open(p); p.read_text(); p.read_bytes(); p.open(); json.load(p)\n"
        "    subprocess.run(['x']); subprocess.Popen(['x']); os.system('x')\n"
        "    open(p, 'w'); p.open('a'); os.open(p, 0)\n"
    )
    assert sorted(w for _, w in calls(src)) == sorted(
        ["open", "read_text", "read_bytes", "open", "json.load", "subprocess.run", "subprocess.Popen", "os.system"]
    )
