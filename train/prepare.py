"""``python -m train.prepare --config FILE.yaml [key.sub=value ...]``: tokenize, render and pack the data once.

Takes the training config (the same file and overrides as ``python -m train``) and writes the
prepared data to ``data.prepared`` (default ``<log.dir>/data``; see ``train.data.prepared``).
Run as a Slurm job (``python -m hpc.submit ... -- -m train.prepare --config FILE``) it splits
the chunks of the source over all tasks (RANK/WORLD_SIZE, else SLURM_PROCID/SLURM_NTASKS); the
output is byte-identical for any number of tasks. A directory prepared with other settings or
sources is prepared again. Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time

from hpc.node.cli import HpcError, Parser, fail, path_text, shown
from hpc.node.contract import RANK_VAR, WORLD_SIZE_VAR

PROG = "train.prepare"


def task_of(environ: dict) -> tuple[int, int]:
    """(rank, world) from torchrun's or Slurm's variables; (0, 1) outside both."""
    for rank_var, world_var in ((RANK_VAR, WORLD_SIZE_VAR), ("SLURM_PROCID", "SLURM_NTASKS")):
        if rank_var in environ and world_var in environ:
            if not all(re.fullmatch(r"[0-9]{1,10}", environ[v]) for v in (rank_var, world_var)):  # not "1_0", " 1"
                raise HpcError(
                    f"environment {rank_var}={shown(environ[rank_var])} / {world_var}={shown(environ[world_var])}: "
                    "must be whole numbers"
                )
            rank, world = int(environ[rank_var]), int(environ[world_var])
            if not 0 <= rank < world:
                raise HpcError(f"environment {rank_var}={rank} must be in [0, {world_var}={world})")
            return rank, world
    return 0, 1


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=f"python -m {PROG}", description="Tokenize, render and pack training data once.")
    parser.add_argument(
        "--config", required=True, type=path_text, help="the training YAML config, e.g. train/configs/chat.yaml"
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="config overrides, as for python -m train"
    )
    args = parser.parse_args(argv)

    from train.data.prepared import describe, key_of, prepare, read_manifest, summary
    from train.data.tokenizer import load_tokenizer
    from train.front.config import ConfigError, load_config
    from train.front.tokenizer import tokenizer_source

    try:
        cfg = load_config(args.config, args.overrides)
        rank, world = task_of(os.environ)
        if not cfg.data.packed:
            raise ConfigError(
                f"{args.config}: data.pack=stream reads the token cache; train.prepare prepares packed data "
                "(data.format=chat, or data.pack=documents)"
            )
        name = tokenizer_source(cfg.data.tokenizer, cfg.model.path, cfg.data.format == "chat")
        tokenizer = load_tokenizer(name)
        out = cfg.prepared_dir
        manifest = read_manifest(out)
        if manifest is not None and manifest.get("key") == key_of(describe(cfg.data, cfg.seq_len, tokenizer)):
            if rank == 0:
                print(f"[prepare] already prepared: {summary(manifest, out)}", flush=True)
            return 0
        t0 = time.perf_counter()
        made = [d for d in (out, *out.parents) if not d.exists()]
        try:
            manifest = prepare(
                cfg.data, cfg.seq_len, tokenizer, name, out, rank, world, log=lambda m: print(m, flush=True)
            )
        except HpcError:
            if world == 1 and made:  # alone: nobody waits for the error file; leave nothing this run made behind
                shutil.rmtree(made[-1], ignore_errors=True)
            raise
    except HpcError as e:
        fail(PROG, e)
    if manifest is not None:
        print(f"[prepare] done in {time.perf_counter() - t0:.1f}s (last task): {summary(manifest, out)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
