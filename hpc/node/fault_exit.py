"""A rank program ending on an exception: the fault table's verdict (`hpc.node.fault_table`) becomes its exit code
(`EXIT_NODE_FAULT`, 94, for a suspected node fault; 1 for the program's error) and, in a job with spare nodes, a
record the restart supervisor reads (`hpc.node.attempt.record_fault`). The trainer does this itself; a script of
your own does it with

    from hpc.node.fault_exit import reported_faults

    with reported_faults():
        main()

and marks an exception of its own either way with `hpc.node.fault_table.mark_node_fault` / ``mark_program_error``.
"""

from __future__ import annotations

import os
import sys
import traceback
from contextlib import contextmanager
from dataclasses import asdict
from typing import Iterator, Mapping

from hpc.node.attempt import record_fault
from hpc.node.contract import EXIT_FAILED, EXIT_NODE_FAULT, RANK_VAR
from hpc.node.fault_table import NODE, classify
from hpc.node.slurm_env import node_name


def exit_code(exc: BaseException, environ: Mapping[str, str] = os.environ) -> int:
    """Judge ``exc``, say so in one line on stderr, leave the record, and return the exit code to end with."""
    verdict = classify(exc)
    code = EXIT_NODE_FAULT if verdict.cause == NODE else EXIT_FAILED
    rank_text = environ.get(RANK_VAR, "")
    node = node_name(environ)
    cause = "a suspected fault of this node" if verdict.cause == NODE else "the program's error"
    print(
        f"[fault] rank {rank_text or '?'} on {node}: {verdict.signature} ({verdict.what}): {cause}, exit {code}",
        file=sys.stderr,
        flush=True,
    )
    if rank_text.isdigit():
        try:
            record_fault(
                int(rank_text), node, {**asdict(verdict), "signature": verdict.signature, "exit": code}, environ
            )
        except OSError:  # the exit code still says it
            pass
    return code


@contextmanager
def reported_faults() -> Iterator[None]:
    """Run the block; an exception out of it prints its traceback and exits with `exit_code`'s code (``sys.exit`` and
    Ctrl-C pass through)."""
    try:
        yield
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        traceback.print_exc()
        sys.exit(exit_code(e))
