"""The calls of hpc.integrations as one command for the bad-input survey: ``main([CALL, ARGS_JSON])`` makes the call
a user's script makes (``requeue``: ``Requeue(accelerator, **args)``; ``callback``: ``RequeueCallback(**args)``;
``newest``: ``newest_complete_checkpoint(**args)``; ``batches``: ``Requeue(accelerator, dir).batches(**args)``) and
reports its IntegrationError as a script would print it: one line, exit 2. In ARGS_JSON ``{"path": P}`` stands for
``pathlib.Path(P)`` and ``{"generator": []}`` for an iterator without a length."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hpc.node.cli import error_line

PROG = "integrations"


def _value(v):
    if isinstance(v, dict) and set(v) == {"path"}:
        return Path(v["path"])
    if isinstance(v, dict) and set(v) == {"generator"}:
        return iter(v["generator"])
    return v


def main(argv: list[str]) -> int:
    from hpc.integrations.checkpoints import IntegrationError

    call, args = argv[0], {k: _value(v) for k, v in json.loads(argv[1]).items()}
    try:
        if call == "newest":
            from hpc.integrations.checkpoints import newest_complete_checkpoint

            newest_complete_checkpoint(**args)
        elif call == "callback":
            from hpc.integrations.transformers import RequeueCallback

            RequeueCallback(**args)
        else:
            from hpc.integrations.accelerate import Requeue

            if call == "requeue":
                Requeue(object(), **args)
            else:
                Requeue(object(), Path.cwd() / "ckpt").batches(**args)
    except IntegrationError as e:
        print(error_line(PROG, e), file=sys.stderr)
        return 2
    return 0
