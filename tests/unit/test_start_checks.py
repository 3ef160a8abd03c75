"""Submit knows what start knows. The trainer's refusals of bad input are found in its source (every ``raise`` of
ConfigError, DataError or HpcError under train/, by function) and each is one of:

* shared: a function the login side runs too (``hpc.submit`` traced running it, below);
* guarded: a refusal deep in the torch code that ``train.front.run_check`` makes first with the same function's line:
  its cases are refused by ``python -m train`` (in process, as rank 0 of the job's ranks, before any process group)
  and by ``hpc.submit --dry-run`` for the same ranks, with the same line;
* only at the start: what cannot be known before the job runs, with the reason.

A new refusal fails this test until it is sorted into one of them."""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from train_helpers import FP8_SITE
from train_helpers import TINY as TINY_PATH

TINY = str(TINY_PATH)
BAD_INPUT = {"ConfigError", "DataError", "HpcError"}
OWN_COMMANDS = ("train/generate.py", "train/prepare.py")  # their own commands, not the trainer's start

SHARED = {
    "train/front/config.py:TrainConfig.check_paths",
    "train/front/config.py:apply_overrides",
    "train/front/config.py:split_cli",
    "train/front/config.py:load_config",
    "train/front/data_sources.py:source_path",
    "train/front/tokenizer.py:tokenizer_dir",
    "train/front/layout.py:ParallelDims.build",
    "train/front/run_check.py:check_run",
    "train/front/run_check.py:model_dims",
    "train/front/config.py:_validated",
}
GUARDED = {  # function -> the cases below that make its refusal
    "train/adapters.py:apply_lora": ["lora-target-missing", "lora-target-missing-dense-layers"],
    "train/adapters.py:nf4_weight": ["nf4-block"],
    "train/model.py:hf_config": ["model-type", "vocab"],
    "train/model.py:_load_hf_shards": ["no-weights"],
    "train/model.py:_stream_one_rank": ["no-weights"],  # the same weights_problem line, for a QLoRA base
}
AT_START = {
    "train/__main__.py:_check_snapshot_job": (
        "the rank's Slurm job id, under which checkpoint.memory_every keeps its snapshots (a submitted job has one)"
    ),
    "train/__main__.py:_take_lease": (
        "another live run holding the checkpoint directory when the job starts (its lease)"
    ),
    "train/front/layout.py:WorldEnv.from_env": (
        "the rank's environment, which hpc.node.launch derives from Slurm's on each node"
    ),
    "train/front/layout.py:WorldEnv.from_env.get": (
        "the rank's environment, which hpc.node.launch derives from Slurm's on each node"
    ),
    "train/float8.py:require_fp8": "the rank's GPU (its compute capability) and torchao where it runs",
    "train/faults.py:parse": "tests only: the faults a test asks the ranks to inject into themselves (HPC_TEST_FAULTS)",
    "train/adapters.py:nf4_api": (
        "torchao's NF4 where the rank runs (the login side finds only that torchao is installed)"
    ),
    "train/packed_attention.py:check_packed_attention": "the nodes' transformers, tried on a one-layer model",
    "train/data/tokenizer.py:load_tokenizer": (
        "the tokenizer as transformers loads it (the login side never imports transformers)"
    ),
    "train/loop.py:Trainer._check_checkpoints": (
        "the checkpoint directory's content when the job starts (another job "
        "of the run may write it while this one waits)"
    ),
    "train/loop.py:Trainer._prepare_checkpoints": "the checkpoint directory's content when the job starts",
    "train/loop.py:Trainer._resume": "the checkpoint directory's content when the job starts",
    "train/model.py:_check_hf_tensors": "the weights' content (safetensors headers), read by each rank",
    "train/metrics.py:MetricsLog._keep_until": "the run directory's metrics file when the job starts",
    "train/front/data_sources.py:_load_dataset": "the data's content, read by the ranks",
    "train/front/data_sources.py:_jsonl_records": "the data's content, read by the ranks",
    "train/front/data_sources.py:records": "the data's content, read by the ranks",
    "train/data/text.py:load_tokens_on_rank0": "the data's content, read by the ranks",
    "train/data/formats.py:TextFormat.samples": "the data's content, read by the ranks",
    "train/data/formats.py:ChatFormat.__init__": "the chat template as transformers renders it",
    "train/data/formats.py:ChatFormat.messages": "the data's content, read by the ranks",
    "train/data/formats.py:ChatFormat._refuse_special_text": "the data's content, read by the ranks",
    "train/data/formats.py:ChatFormat.spans": "the data's content, read by the ranks",
    "train/data/prepared.py:read_manifest": "the prepared data's files when the job starts",
    "train/data/prepared.py:prepare": "the data's content, read by the ranks",
    "train/data/prepared.py:wait_until_prepared": "the data's content, read by the ranks",
    "train/data/prepared.py:PreparedData.__init__": "the prepared data's files when the job starts",
    "train/data/stream.py:TokenStream.__init__": "the data's size in tokens",
    "train/data/stream.py:TokenStream.load_state_dict": "a checkpoint's data position",
    "train/data/stream.py:PackedStream.__init__": "the data's size in rows",
    "train/data/stream.py:eval_batches": "the held-out data's size in rows",
}


def refusal_sites() -> set[str]:
    """``path:function`` of every raise of a bad-input error in the trainer's modules."""
    found = set()

    def visit(node, scope: list[str], rel: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, scope + [child.name], rel)
                continue
            exc = child.exc if isinstance(child, ast.Raise) else None
            if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.func.id in BAD_INPUT:
                found.add(f"{rel}:{'.'.join(scope)}")
            visit(child, scope, rel)

    for path in sorted((ROOT / "train").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel not in OWN_COMMANDS:
            visit(ast.parse(path.read_text()), [], rel)
    return found


def test_every_refusal_of_the_trainer_is_sorted():
    sites = refusal_sites()
    sorted_ = SHARED | set(GUARDED) | set(AT_START)
    assert not sites - sorted_, f"refusals not sorted into SHARED, GUARDED or AT_START: {sorted(sites - sorted_)}"
    assert not sorted_ - sites, f"sorted but no longer raised: {sorted(sorted_ - sites)}"
    assert {c for cases in GUARDED.values() for c in cases} <= {c[0] for c in CASES}


def test_the_shared_refusals_run_at_submit(tmp_path, monkeypatch, capsys):
    """hpc.submit --dry-run of the trainer runs every SHARED function (traced)."""
    ran: set[str] = set()
    root = str(ROOT) + "/"

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root + "train/"):
            ran.add(f"{frame.f_code.co_filename[len(root) :]}:{frame.f_code.co_qualname.replace('.<locals>', '')}")

    from hpc.submit import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    sys.setprofile(profile)
    try:
        with pytest.raises(SystemExit) as e:
            main(["--site", "local", "--nodes", "1", "--dry-run", "--", "--config", TINY, "optim.lr=1e-3"])
    finally:
        sys.setprofile(None)
    assert e.value.code == 0, capsys.readouterr().err
    assert not SHARED - ran, f"not run by hpc.submit: {sorted(SHARED - ran)}"


QWEN3 = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 2048,
}
TOKENIZER = {p.name: p.read_text() for p in (ROOT / "train" / "assets" / "tokenizer").iterdir() if p.is_file()}
MODEL = ["model.shape=null", "model.path={T}/m"]

# (id, trainer overrides, (nodes, GPUs per node), files, the line's telling part)
CASES = [
    (
        "lora-target-missing",
        ["model.shape=tiny-moe", "lora.enabled=true"],
        (1, 1),
        {},
        "lora.target_modules: gate_proj is not a linear layer of decoder layer 0 (it has: k_proj, o_proj, q_proj, "
        "v_proj)",
    ),
    (
        "lora-target-missing-dense-layers",
        [*MODEL, "lora.enabled=true", "lora.target_modules=[q_proj,down_proj]"],
        (1, 1),
        {
            "m/config.json": json.dumps(
                {
                    **QWEN3,
                    "model_type": "qwen3_moe",
                    "num_experts": 4,
                    "num_experts_per_tok": 2,
                    "moe_intermediate_size": 32,
                    "mlp_only_layers": [0],
                }
            ),
            "m/model.safetensors": "x",
        },
        "lora.target_modules: down_proj is not a linear layer of decoder layer 1",
    ),
    (
        "nf4-block",
        [
            "lora.enabled=true",
            "lora.quantize_base=nf4",
            "model.dims.hidden_size=36",
            "model.dims.intermediate_size=100",
        ],
        (1, 1),
        {},
        "lora.quantize_base=nf4: model.layers.0.mlp.gate_proj holds 100 x 36 weights, not a multiple of 64",
    ),
    (
        "nf4-ranks",
        ["lora.enabled=true", "lora.quantize_base=nf4"],
        (1, 2),
        {},
        "lora.quantize_base=nf4 trains on one rank (one GPU); this job has WORLD_SIZE=2",
    ),
    (
        "nf4-nodes",
        ["lora.enabled=true", "lora.quantize_base=nf4", "global_batch=4"],
        (2, 1),
        {},
        "lora.quantize_base=nf4 trains on one rank (one GPU); this job has WORLD_SIZE=2",
    ),
    (
        "straggler-slow-rank",
        ["straggler.test_slow_rank=2", "straggler.test_slow_s=0.1"],
        (1, 2),
        {},
        "straggler.test_slow_rank=2: the run has ranks 0 to 1",
    ),
    (
        "straggler-stop-rank",
        ["straggler.test_stop_rank=4"],
        (2, 2),
        {},
        "straggler.test_stop_rank=4: the run has ranks 0 to 3",
    ),
    (
        "top-k",
        ["model.shape=tiny-moe", "model.dims.num_experts_per_tok=9"],
        (1, 1),
        {},
        "model.dims.num_experts_per_tok=9 is more than num_experts=8",
    ),
    (
        "top-k-path",
        MODEL,
        (1, 1),
        {"m/config.json": json.dumps({**QWEN3, "model_type": "qwen3_moe", "num_experts": 2, "num_experts_per_tok": 4})},
        "config.json: num_experts_per_tok=4 is more than num_experts=2",
    ),
    (
        "moe-dims-dense",
        ["model.dims.num_experts=8"],
        (1, 1),
        {},
        "model.dims.num_experts applies to a mixture of experts",
    ),
    (
        "model-type",
        MODEL,
        (1, 1),
        {"m/config.json": json.dumps({**QWEN3, "model_type": "llama"})},
        "holds a llama model; allowed: qwen3, qwen3_moe",
    ),
    (
        "vocab",
        ["model.dims.vocab_size=1000"],
        (1, 1),
        {},
        "model: vocab_size=1000 is smaller than the tokenizer's 2048 tokens",
    ),
    ("no-weights", MODEL, (1, 1), {"m/config.json": json.dumps(QWEN3)}, "has no *.safetensors files"),
    ("ep-dense", ["parallel.ep=2"], (1, 2), {}, "parallel.ep=2 needs a mixture-of-experts model"),
    (
        "ep-divides",
        ["model.shape=tiny-moe", "parallel.ep=2", "global_batch=6", "micro_batch=2"],
        (3, 1),
        {},
        "parallel.ep=2 must divide parallel.dp=3 and the model's num_experts=8",
    ),
    (
        "tp-kv",
        ["parallel.tp=2", "model.dims.num_key_value_heads=1", "model.dims.num_attention_heads=1"],
        (1, 2),
        {},
        "parallel.tp=2 must divide the model's num_key_value_heads=1",
    ),
    ("lora-key-alone", ["lora.r=8"], (1, 1), {}, "lora.r is set but lora.enabled is not"),
    (
        "merge-without-export",
        ["lora.enabled=true", "lora.merge=true"],
        (1, 1),
        {},
        "lora.merge=true writes the merged model",
    ),
]


def _fill(text: str, tmp: Path) -> str:
    return text.replace("{T}", str(tmp))


def _setup(tmp: Path, files: dict, monkeypatch) -> None:
    for rel, text in {
        **files,
        **({f"m/{k}": v for k, v in TOKENIZER.items()} if any(k.startswith("m/") for k in files) else {}),
    }.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp))
    monkeypatch.chdir(tmp)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_trainers_refusal_is_made_at_submit_with_the_same_line(case, tmp_path, monkeypatch, capsys):
    import signal

    cid, overrides, (nodes, gpus), files, says = case
    overrides = [_fill(o, tmp_path) for o in overrides]
    _setup(tmp_path, files, monkeypatch)
    monkeypatch.syspath_prepend(str(FP8_SITE))  # torchao (QLoRA's NF4), found where scripts/install.sh puts it
    saved = {
        s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)
    }  # the trainer catches them: restored below
    world = nodes * gpus
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(gpus))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29981")
    monkeypatch.setenv("HPC_DIST_TIMEOUT_S", "5")  # a refusal missed before the process group fails, never hangs
    from train.__main__ import main as train_main

    try:
        code = train_main(["--config", TINY, *overrides, f"log.dir={tmp_path}/run"])
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    started = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(started) == 1, started
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name)
    from hpc.submit import main as submit_main

    with pytest.raises(SystemExit) as e:
        submit_main(
            [
                "--site",
                "local",
                "--nodes",
                str(nodes),
                "--gpus-per-node",
                str(gpus),
                "--dry-run",
                "--",
                "--config",
                TINY,
                *overrides,
            ]
        )
    submitted = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(submitted) == 1, submitted
    assert started[0].startswith("train: error: ") and submitted[0].startswith("hpc.submit: error: trainer: "), (
        started,
        submitted,
    )
    assert says in started[0] and says in submitted[0], (says, started[0], submitted[0])
    at_start, at_submit = started[0][started[0].index(says) :], submitted[0][submitted[0].index(says) :]
    assert at_start == at_submit
    assert not (tmp_path / "run").exists() and not (tmp_path / "jobs").exists()


# ---------------------------------------------------------------- nothing is left behind by a refusal


def _start(tmp: Path, monkeypatch, capsys, *overrides: str) -> tuple[int, str]:
    """``python -m train`` in process on one rank, as job ``mine``; its exit code and its one error line."""
    import signal

    from train.__main__ import main as train_main

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HPC_JOB_NAME", "mine")
    monkeypatch.chdir(tmp)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        code = train_main(["--config", TINY, "steps=1", "schedule.warmup_steps=0", *overrides])
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 1, errors
    return code, errors[0]


def _owned(directory: Path, job: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".owner.json").write_text(json.dumps({"job_name": job}) + "\n")
    return directory


def test_a_refused_checkpoint_directory_leaves_no_log_directory(tmp_path, monkeypatch, capsys):
    ckpt = _owned(tmp_path / "ckpt", "another-job")
    code, line = _start(tmp_path, monkeypatch, capsys, f"log.dir={tmp_path}/run", f"checkpoint.dir={ckpt}")
    assert code == 2 and "checkpoint.dir" in line and "another-job" in line
    assert not (tmp_path / "run").exists()


def test_a_refused_lease_leaves_no_log_directory(tmp_path, monkeypatch, capsys):
    import socket
    import time

    ckpt = _owned(tmp_path / "ckpt", "mine")
    (ckpt / ".lease.json").write_text(
        json.dumps(
            {
                "run_id": "live",
                "job_id": None,
                "job_name": "mine",
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.time(),
            }
        )
    )
    code, line = _start(tmp_path, monkeypatch, capsys, f"log.dir={tmp_path}/run", f"checkpoint.dir={ckpt}")
    assert code == 2 and "is in use by a run 'mine'" in line
    assert not (tmp_path / "run").exists() and sorted(p.name for p in ckpt.iterdir()) == [".lease.json", ".owner.json"]


def test_a_fresh_start_refused_later_moves_no_checkpoint_aside(tmp_path, monkeypatch, capsys):
    """checkpoint.restart=fresh moves the old run's files aside only once the data and the model are set up: a data
    error found then leaves the checkpoints and metrics.jsonl where they were."""
    run = _owned(tmp_path / "run", "mine")
    ckpt = _owned(run / "checkpoints", "mine")
    (ckpt / "step-00000002").mkdir()
    (ckpt / "step-00000002" / "meta.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\nnot json\n')
    code, line = _start(
        tmp_path, monkeypatch, capsys, f"log.dir={run}", "checkpoint.restart=fresh", f"data.path={tmp_path}/d.jsonl"
    )
    assert code == 2 and "data.path" in line
    assert (ckpt / "step-00000002" / "meta.json").is_file() and (run / "metrics.jsonl").is_file()
    assert not [p for p in ckpt.iterdir() if p.name.startswith("before-fresh")]
