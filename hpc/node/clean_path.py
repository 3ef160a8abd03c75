"""The working directory off ``sys.path`` for the project's own command lines. ``python -m`` puts the working
directory first on ``sys.path``, so a ``train.py`` or a ``train/`` package of the user's there would be imported in
place of the project's; hpc/__init__.py drops it for every ``python -m hpc...`` before anything imports
``train`` (and `hpc.node.project_module` runs the trainer that way on the ranks). A script of the user's keeps its
folder first on ``sys.path`` (its sibling modules import as always), so nothing needs Python 3.11's ``-P``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Sequence

OWN_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds hpc/ (and train/, in a checkout)
_TAKES_VALUE = "cmWX"  # python's short options that take a value (-c CMD, -m MOD, -W ARG, -X OPT), joined or next


def module_run(orig_argv: Sequence[str]) -> Optional[str]:
    """The module of ``python [OPTIONS] -m MODULE ...`` as the interpreter reads its command line (``sys.orig_argv``);
    None for a script, ``-c`` or an interactive interpreter."""
    args = iter(orig_argv[1:])
    for arg in args:
        if arg == "--check-hash-based-pycs":
            next(args, None)
            continue
        if not arg.startswith("-") or arg in ("-", "--"):
            return None
        if arg.startswith("--"):
            continue
        for i, flag in enumerate(arg[1:], 1):
            if flag in _TAKES_VALUE:
                value = arg[i + 1 :] or next(args, "")
                if flag == "c":
                    return None
                if flag == "m":
                    return value
                break
    return None


def without_working_dir(path: Sequence[str], cwd: str, own_root: Path = OWN_ROOT) -> list[str]:
    """``path`` without the entries that name ``cwd`` ('' or its path), unless ``cwd`` is the project's own root (a
    checkout run from its top, where ``hpc`` and ``train`` are the project's)."""
    real_cwd = os.path.realpath(cwd)
    if real_cwd == os.path.realpath(own_root):
        return list(path)
    return [p for p in path if os.path.realpath(os.path.join(cwd, p) if p else cwd) != real_cwd]


def drop_working_dir(module: Optional[str]) -> None:
    """For ``python -m hpc...`` (``module``), take the working directory off ``sys.path`` (see the module's text)."""
    if module is None or module.split(".")[0] != "hpc" or getattr(sys.flags, "safe_path", False):
        return
    try:
        cwd = os.getcwd()
    except OSError:  # a removed working directory: nothing of it can be imported
        return
    sys.path[:] = without_working_dir(sys.path, cwd)
