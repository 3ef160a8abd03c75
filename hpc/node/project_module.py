"""``python -m hpc.node.project_module MODULE ARGS...``: ``python -m MODULE ARGS`` with the working directory off
``sys.path`` (hpc/__init__.py, `hpc.node.clean_path`), so the ranks run the project's trainer even where the job's
working directory holds a ``train.py`` or ``train/`` of the user's. A ``hpc.py`` or ``hpc/`` of the user's there is
found before any code of the project runs: nothing here can help that (docs/troubleshooting.md)."""

from __future__ import annotations

import importlib.util
import runpy
import sys
from typing import Optional, Sequence

from hpc.node.cli import fail, shown
from hpc.node.contract import PROJECT_MODULE

PROG = PROJECT_MODULE


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        fail(PROG, f"give the module to run first, e.g. python -m {PROG} train --config FILE (got {shown(argv[:1])})")
    module = argv[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or an empty name part
        found = False
    if not found:
        fail(PROG, f"module {shown(module)}: not found for {sys.executable}")
    sys.argv = [module, *argv[1:]]  # run_module puts the module's file first, as python -m does
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
