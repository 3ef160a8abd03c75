"""The bad-input survey's cases: every command line of the project given bad (and hostile-but-valid) input.

A case is a command (its module's ``main(argv)``), its arguments, files made in a fresh working directory
(``{T}`` in an argument, file or variable is that directory) and environment changes. ``names`` is what the one
error line must contain (the flag, file or key); ``expect="ok"`` marks hostile input that must be accepted,
with ``check`` (tmp, stdout) -> problem or None. tests/unit/test_bad_inputs.py runs them.
"""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "train" / "configs" / "tiny.yaml")
HUGE = "9" * 5000
UNICODE_DIGIT = "\u0663"  # ARABIC-INDIC DIGIT THREE: str.isdigit() says yes, Slurm says no


@dataclass
class Case:
    id: str
    cli: str  # the module whose main(argv) runs it
    argv: list[str]
    names: Optional[str] = None  # what the error line names (case-insensitive)
    files: dict[str, bytes | str] = field(default_factory=dict)
    env: dict[str, Optional[str]] = field(default_factory=dict)  # None removes the variable
    expect: str = "error"  # "error" (exit 2, one line) or "ok" (exit 0)
    check: Optional[Callable[[Path, str], Optional[str]]] = None


# ---------------------------------------------------------------- fixtures

BASE_SITE = yaml.safe_load((ROOT / "site_configs" / "local.yaml").read_text())
BASE_SITE["paths"] = {"job_dir": "{T}/jobs", "checkpoint_root": "{T}/ckpt"}
BASE_SITE["partitions"][0]["gpu_memory_gb"] = 80
BASE_SITE["name"] = "survey"
DELETE = object()


def merged(base: dict, changes: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        node, parts = out, key.split(".")
        for p in parts[:-1]:
            node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
        last = parts[-1]
        if isinstance(node, list):
            node[int(last)] = value
        elif value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return out


def site_yaml(**changes) -> str:
    return yaml.safe_dump(merged(BASE_SITE, {k.replace("__", "."): v for k, v in changes.items()}), sort_keys=False)


TINY_CFG = {
    "model": {"shape": "tiny"},
    "data": {"path": None, "tokenizer": None},
    "seq_len": 16,
    "micro_batch": 1,
    "global_batch": 2,
    "steps": 1,
    "log": {"dir": "{T}/run", "log_every": 1},
    "checkpoint": {"interval": 0},
}


def cfg_yaml(changes: dict) -> str:
    return yaml.safe_dump(merged(TINY_CFG, changes), sort_keys=False)


SCRIPT = {"s.py": "print('rank ran')\n"}
SUBMIT, SITE, DRY = "hpc.submit", ["--site", "local"], ["--nodes", "1", "--dry-run"]
RANK = ["--", "{T}/s.py"]


def exported(var: str, want: str, script: str = "job.sbatch"):
    """The emitted script exports ``var`` as exactly ``want``, as a POSIX shell reads the quoted word."""

    def check(tmp: Path, stdout: str) -> Optional[str]:
        text = (tmp / script).read_text()
        start = text.find(f"\nexport {var}=")
        if start < 0:
            return f"no 'export {var}=' line"
        lex = shlex.shlex(text[start + len(f"\nexport {var}=") :], posix=True)
        lex.whitespace_split, lex.whitespace, lex.commenters = True, " \t\n", ""
        got = lex.get_token() or ""
        expected = want.replace("{T}", str(tmp))
        return None if got == expected else f"{var} reads as {got!r}, not {expected!r}"

    return check


# ---------------------------------------------------------------- numbers

BAD_NUMBERS = {
    "neg": "-1",
    "nan": "nan",
    "inf": "inf",
    "ninf": "-inf",
    "e400": "1e400",
    "abc": "abc",
    "empty": "",
    "huge": HUGE,
    "space": " 1 ",
    "hex": "0x10",
    "unicode": UNICODE_DIGIT,
    "comma": "1,5",
}
BAD_WHOLE = {**BAD_NUMBERS, "frac": "1.5", "big": "1" + "0" * 29}


RESTART_FLAGS = ("--nodes", "--tasks-per-node", "--ranks", "--max-restarts", "--max-restarts-per-node")


def number_cases() -> list[Case]:
    """Every numeric flag of every command: 0 (where not allowed), negative, nan, inf, huge, not a number."""
    c: list[Case] = []
    site_s = ["--site", "local"]
    flags = [  # (cli, argv before the flag, flag, argv after, zero allowed, whole numbers)
        (SUBMIT, site_s + ["--dry-run"], "--nodes", RANK, False, True),
        (SUBMIT, site_s + DRY, "--gpus-per-node", RANK, False, True),
        (SUBMIT, site_s + DRY, "--signal-lead", RANK, False, True),
        (SUBMIT, site_s + DRY, "--max-requeues", RANK, True, True),
        (SUBMIT, site_s + DRY, "--spare-nodes", RANK, True, True),
        (SUBMIT, site_s + DRY + ["--sweep", "seed=1,2"], "--max-parallel", [], False, True),
        (SUBMIT, site_s + DRY, "--time", RANK, False, False),
        ("hpc.plan", ["--site", "ib-h200", "--model", "8B"], "--nodes", [], False, True),
        ("hpc.plan", ["--site", "ib-h200", "--model", "8B", "--nodes", "1"], "--gpus-per-node", [], False, True),
        ("hpc.plan", ["--site", "ib-h200", "--model", "8B", "--nodes", "1"], "--seq-len", [], False, True),
        ("hpc.plan", ["--site", "ib-h200", "--model", "8B", "--nodes", "1"], "--micro-batch", [], False, True),
        ("hpc.preflight", site_s, "--nodes", [], False, True),
        ("hpc.preflight", site_s + ["--nodes", "1"], "--gpus-per-node", [], False, True),
        ("hpc.preflight", site_s + ["--nodes", "1"], "--min-fraction", [], False, False),
        ("hpc.preflight", site_s + ["--nodes", "1"], "--min-bytes", [], False, True),
        ("hpc.preflight", site_s + ["--nodes", "1"], "--max-bytes", [], False, True),
        ("hpc.preflight", site_s + ["--nodes", "1"], "--iters", [], False, True),
        ("hpc.preflight", site_s + ["--nodes", "1"], "--time", [], False, False),
        ("hpc.jobs", ["logs", "12"], "--rank", [], True, True),
        ("hpc.node.launch", [], "--gpus-per-node", ["--", "true"], False, True),
        *(
            (
                "hpc.node.restart",
                [f for g in RESTART_FLAGS if g != flag for f in (g, "1")] + ["--marks", "{T}/m"],
                flag,
                ["--", "srun", "true"],
                flag == "--max-restarts",
                True,
            )
            for flag in RESTART_FLAGS
        ),
        ("hpc.node.smoke", ["--out", "{T}/o"], "--timeout", [], False, False),
        ("hpc.node.preflight_node", ["--out", "{T}/o"], "--min-bytes", [], False, True),
        ("hpc.node.preflight_node", ["--out", "{T}/o"], "--max-bytes", [], False, True),
        ("hpc.node.preflight_node", ["--out", "{T}/o"], "--iters", [], False, True),
        ("hpc.node.preflight_node", ["--out", "{T}/o"], "--pair-sizes", [], False, True),
        ("train.generate", ["{T}/model"], "--tokens", [], False, True),
    ]
    for cli, before, flag, after, zero_ok, whole_only in flags:
        values = dict(BAD_WHOLE if whole_only else BAD_NUMBERS)
        if not zero_ok:
            values["zero"] = "0"
        tail = after if cli != SUBMIT or flag != "--max-parallel" else ["--", "--config", TINY]
        for vid, value in values.items():
            names = flag if not (flag == "--time" and vid == "ninf") else "--time"
            c.append(
                Case(f"num-{cli}-{flag.strip('-')}-{vid}", cli, before + [flag, value] + tail, names, files=SCRIPT)
            )
    # numbers from the environment of a node program
    for var in ("HPC_DIST_TIMEOUT_S",):
        for vid, value in {**BAD_NUMBERS, "zero": "0"}.items():
            if value.strip() == "":
                continue
            c.append(
                Case(
                    f"num-launch-env-{var}-{vid}", "hpc.node.launch", ["--", "true"], var, env={**SRUN_ENV, var: value}
                )
            )
    return c


# ---------------------------------------------------------------- the trainer's config: overrides and files

FLOAT_KEYS = [
    "optim.lr",
    "optim.eps",
    "optim.weight_decay",
    "grad_clip",
    "schedule.min_lr",
    "eval.fraction",
    "model.dims.rope_theta",
]
INT_KEYS = [
    "steps",
    "seq_len",
    "micro_batch",
    "global_batch",
    "schedule.warmup_steps",
    "checkpoint.interval",
    "checkpoint.keep_last",
    "checkpoint.memory_every",
    "eval.every",
    "eval.batches",
    "log.log_every",
    "parallel.tp",
    "parallel.dp",
    "parallel.cp",
    "data.chunk_bytes",
    "model.dims.hidden_size",
    "model.dims.num_hidden_layers",
    "seed",
]
NON_FINITE = {"inf": "inf", "dotinf": ".inf", "ninf": "-.inf", "nan": ".nan", "e400": "1e400", "ne400": "-1e400"}
YAML11 = {
    "octal": "010",
    "sexagesimal": "1:30",
    "true": "true",
    "comment": "#1",
    "space-comment": "1 #2",
    "tilde": "~",
    "empty": "",
    "yes": "yes",
    "frac": "1.5",
    "huge": HUGE,
    "hex": "0x10",
}


def config_cases() -> list[Case]:
    c: list[Case] = []
    train = ["--config", TINY]
    for key in FLOAT_KEYS:
        for vid, value in NON_FINITE.items():
            c.append(Case(f"cfg-override-{key}-{vid}", "train", train + [f"{key}={value}"], key))
            c.append(
                Case(
                    f"cfg-file-{key}-{vid}",
                    "train",
                    ["--config", "{T}/c.yaml"],
                    key,
                    files={"c.yaml": with_text(cfg_yaml({key: PLACE}), value)},
                )
            )
        c.append(Case(f"cfg-override-{key}-true", "train", train + [f"{key}=true"], key))
    c.append(Case("cfg-override-betas-inf", "train", train + ["optim.betas=[.inf, 0.9]"], "optim.betas"))
    c.append(Case("cfg-override-betas-nan", "train", train + ["optim.betas=[0.9, .nan]"], "optim.betas"))
    for key in INT_KEYS:
        for vid, value in YAML11.items():
            c.append(Case(f"cfg-override-{key}-{vid}", "train", train + [f"{key}={value}"], key))
        for vid, value in NON_FINITE.items():
            c.append(Case(f"cfg-override-{key}-{vid}", "train", train + [f"{key}={value}"], key))
    for key in ("log.dir", "data.path", "export"):
        for vid in ("comment", "space-comment", "tilde", "empty"):
            c.append(Case(f"cfg-override-{key}-{vid}", "train", train + [f"{key}={YAML11[vid]}"], key))
    c.append(Case("cfg-override-spaces", "train", train + ["steps= 3"], "steps"))
    c.append(Case("cfg-override-no-key", "train", train + ["=3"], "override"))
    c.append(Case("cfg-override-flow-bad", "train", train + ["optim.betas=[0.9,"], "optim.betas"))
    c.append(Case("cfg-override-alias", "train", train + ["optim.betas=*a"], "optim.betas"))
    c.append(Case("cfg-override-section", "train", train + ["optim=3"], "optim"))
    c.append(Case("cfg-override-under-value", "train", train + ["steps.x=3"], "steps"))
    # the file itself
    files = {
        "dup-key": ("steps: 1\nsteps: 2\n", "steps"),
        "dup-nested": (cfg_yaml({}).replace("log:\n", "log:\n  log_every: 3\n", 1), "log_every"),
        "alias-bomb": (
            "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
            "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
            "alias",
        ),
        "nul-escape": (cfg_yaml({}) + 'export: "a\\0b"\n', "NUL"),
        "deep": ("a: " + "[" * 300 + "]" * 300 + "\n", "c.yaml"),
        "huge-int": (cfg_yaml({}).replace("steps: 1", f"steps: {HUGE}"), "digits"),
        "octal": (cfg_yaml({}).replace("steps: 1", "steps: 010"), "leading zero"),
        "python-tag": ("model: !!python/object/apply:os.system ['true']\n", "c.yaml"),
        "binary": (b"\x00\xff\x10\x80" * 50, "c.yaml"),
        "latin1": ("steps: caf\xe9\n".encode("latin-1"), "UTF-8"),
        "empty": ("", "model"),
        "list-top": ("- a\n- b\n", "mapping"),
        "unclosed": ("model: [unclosed\n", "c.yaml"),
        "unknown-key": (cfg_yaml({"optimizer": {"lr": 1}}), "optimizer"),
        "lr-neg": (cfg_yaml({"optim.lr": -1}), "optim.lr"),
        "betas-over-1": (cfg_yaml({"optim.betas": [1.5, 0.95]}), "optim.betas"),
        "steps-0": (cfg_yaml({"steps": 0}), "steps"),
        "steps-true": (cfg_yaml({"steps": True}), "steps"),
        "steps-float": (cfg_yaml({"steps": 2.0}), "steps"),
        "seq-sexagesimal": (cfg_yaml({}).replace("seq_len: 16", "seq_len: 1:30"), "seq_len"),
        "vocab-too-small": (cfg_yaml({"model.dims": {"vocab_size": 10}}), "vocab_size"),
        "tracker-twice": (cfg_yaml({"log.tracker": ["tensorboard", "tensorboard"]}), "log.tracker"),
        "alias-echo": ("model: &m {shape: nosuch}\nx: *m\n", "alias"),
        "long-value": (cfg_yaml({"model.shape": "x" * 100_000}), "model.shape"),
    }
    for cid, (text, names) in files.items():
        c.append(Case(f"cfg-file-{cid}", "train", ["--config", "{T}/c.yaml"], names, files={"c.yaml": text}))
    for cli in ("train", "train.prepare"):
        p = "prep-" if cli == "train.prepare" else ""
        c += [
            Case(f"cfg-{p}config-dir", cli, ["--config", "{T}/adir"], "adir", files={"adir/x": ""}),
            Case(f"cfg-{p}config-fifo", cli, ["--config", "{T}/fifo"], "fifo", files={"fifo": FIFO}),
            Case(f"cfg-{p}config-missing", cli, ["--config", "{T}/nosuch.yaml"], "nosuch.yaml"),
            Case(f"cfg-{p}config-empty-path", cli, ["--config", ""], "--config"),
            Case(f"cfg-{p}config-twice", cli, ["--config", TINY, "--config", TINY], "--config"),
            Case(f"cfg-{p}config-none", cli, [], "--config"),
            Case(f"cfg-{p}non-utf8-override", cli, ["--config", TINY, "log.dir=r\udcff"], "UTF-8"),
        ]
    return c


FIFO = object()  # a files entry: make a named pipe there
PLACE = "@@value@@"


def with_text(text: str, value: str) -> str:
    """YAML text with the placeholder value replaced by ``value`` as written (e.g. 1e400, .inf)."""
    assert PLACE in text
    return text.replace(PLACE, value)


# ---------------------------------------------------------------- the trainer: environment, data, paths


def trainer_cases() -> list[Case]:
    c: list[Case] = []

    def add(cid, cfg=None, args=(), env=None, names=None, files=None):
        c.append(
            Case(
                f"train-{cid}",
                "train",
                ["--config", "{T}/c.yaml", *args],
                names,
                env=env or {},
                files={"c.yaml": cfg_yaml(cfg or {}), **(files or {})},
            )
        )

    add("override-unknown", args=["optim.lrr=1"], names="optim.lrr")
    add("tp-3", args=["parallel.tp=3"], names="parallel.tp")
    add("flag", args=["--lr", "1e-3"], names="--lr")
    add(
        "env-rank-ge-world",
        env={"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"},
        names="RANK",
    )
    add("env-no-master", env={"WORLD_SIZE": "2", "RANK": "0"}, names="MASTER_ADDR")
    add("env-world-abc", env={"WORLD_SIZE": "two"}, names="WORLD_SIZE")
    add("env-world-0", env={"WORLD_SIZE": "0"}, names="WORLD_SIZE")
    add(
        "env-tp-across-nodes",
        args=["parallel.tp=2"],
        env={
            "WORLD_SIZE": "2",
            "RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29998",
        },
        names="parallel.tp",
    )
    add("data-missing", cfg={"data.path": "{T}/nosuch.jsonl"}, names="data.path")
    add("data-suffix", cfg={"data.path": "{T}/d.csv"}, files={"d.csv": "a,b\n"}, names="data.path")
    add("data-nul", cfg={"data.path": "{T}/d\0.jsonl"}, names="NUL")
    add("tokenizer-missing", cfg={"data.tokenizer": "{T}/notok"}, names="tokenizer")
    add(
        "tokenizer-broken-json",
        cfg={"data.tokenizer": "{T}/tok"},
        files={"tok/tokenizer.json": "{not json"},
        names="tokenizer",
    )
    add(
        "tokenizer-broken-config",
        cfg={"data.tokenizer": "{T}/tok"},
        files={"tok/tokenizer_config.json": '{"tokenizer_class": "NoSuchTokenizer"}'},
        names="tokenizer",
    )
    add("tokenizer-empty-json", cfg={"data.tokenizer": "{T}/tok"}, files={"tok/tokenizer.json": ""}, names="tokenizer")
    add("model-path-no-config", cfg={"model": {"path": "{T}/m"}}, files={"m/x": ""}, names="model.path")
    add(
        "model-path-config-broken",
        cfg={"model": {"path": "{T}/m"}},
        files={"m/config.json": "{not json"},
        names="model.path",
    )
    add(
        "model-path-config-list",
        cfg={"model": {"path": "{T}/m"}},
        files={"m/config.json": "[1, 2]"},
        names="model.path",
    )
    add(
        "model-path-config-no-heads",
        cfg={"model": {"path": "{T}/m"}},
        files={"m/config.json": "{}"},
        names="model.path",
    )
    add(
        "model-path-config-huge",
        cfg={"model": {"path": "{T}/m"}},
        files={"m/config.json": '{"num_attention_heads": ' + HUGE + "}"},
        names="model.path",
    )
    add(
        "owner-log",
        files={"owned/.owner.json": json.dumps({"job_name": "other-job"})},
        cfg={"log.dir": "{T}/owned"},
        env={"HPC_JOB_NAME": "mine"},
        names="log.dir",
    )
    add("export-under-file", files={"afile": "x"}, cfg={"export": "{T}/afile/hf"}, names="export")
    # data found bad in the run: one line, and the run directories it made are gone again
    jsonl = {"data.path": "{T}/d.jsonl"}
    for cid, text, names in (
        ("data-bad-json", '{"text": "a"}\nnot json\n', "data.path"),
        ("data-no-field", '{"body": "hello world"}\n', "text_field"),
        ("data-5000-digits", '{"text": "a", "n": ' + HUGE + "}\n", "data.path"),
        ("data-deep-json", '{"text": "a", "n": ' + "[" * 100_000 + "]" * 100_000 + "}\n", "data.path"),
        ("data-not-object", '["text", "a"]\n', "data.path"),
    ):
        add(cid, cfg=jsonl, files={"d.jsonl": text}, names=names)
    add(
        "data-binary-txt", cfg={"data.path": "{T}/d.txt"}, files={"d.txt": b"\xff\xfe\x00\x81" * 100}, names="data.path"
    )
    add("data-too-small", cfg={"data.path": "{T}/d.txt"}, files={"d.txt": "hi"}, names="data")
    chat = {"data.path": "{T}/d.jsonl", "data.format": "chat"}
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    for cid, record, names in (
        ("chat-tools-string", {"messages": turns, "tools": "search"}, "tools"),
        ("chat-tools-dict", {"messages": turns, "tools": {"name": "search"}}, "tools"),
        ("chat-tools-numbers", {"messages": turns, "tools": [1, 2]}, "tools"),
        ("chat-no-assistant", {"messages": turns[:1]}, "assistant"),
        ("chat-role", {"messages": [{"role": "robot", "content": "x"}, turns[1]]}, "role"),
        ("chat-content-list", {"messages": [turns[0], {"role": "assistant", "content": ["x"]}]}, "content"),
        ("chat-messages-string", {"messages": "hi"}, "messages"),
    ):
        add(cid, cfg=chat, files={"d.jsonl": json.dumps(record) + "\n"}, names=names)
        c.append(
            Case(
                f"prepare-{cid}",
                "train.prepare",
                ["--config", "{T}/c.yaml"],
                names,
                files={"c.yaml": cfg_yaml(chat), "d.jsonl": json.dumps(record) + "\n"},
            )
        )
    c.append(
        Case(
            "prepare-5000-digits",
            "train.prepare",
            ["--config", "{T}/c.yaml"],
            "data.path",
            files={"c.yaml": cfg_yaml(chat), "d.jsonl": '{"messages": [], "n": ' + HUGE + "}\n"},
        )
    )
    c.append(
        Case(
            "prepare-not-packed",
            "train.prepare",
            ["--config", "{T}/c.yaml"],
            "data.pack",
            files={"c.yaml": cfg_yaml({})},
        )
    )
    return c


# ---------------------------------------------------------------- hpc.submit

SRUN_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_PROCID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_GPUS_ON_NODE": "2",
}


def submit_cases() -> list[Case]:
    c: list[Case] = []

    def add(cid, flags, names=None, rank=RANK, **kw):
        kw.setdefault("files", SCRIPT)
        c.append(Case(f"submit-{cid}", SUBMIT, list(flags) + list(rank), names, **kw))

    add("nodes-5", SITE + ["--nodes", "5", "--dry-run"], "--nodes")
    add("gpus-3", SITE + DRY + ["--gpus-per-node", "3"], "--gpus-per-node")
    for cid, t in (
        ("time-abc", "abc"),
        ("time-3h", "3:00:00"),
        ("time-unlimited", "UNLIMITED"),
        ("time-neg-part", "1:-5"),
        ("time-days-huge", HUGE + "-00:00:00"),
    ):
        add(cid, SITE + DRY + ["--time", t], "--time")
    add("partition-nosuch", SITE + DRY + ["--partition", "gpu"], "partition")
    add("partition-huge", SITE + DRY + ["--partition", "p" * 10_000], "partition")
    add("launcher-mpirun", SITE + DRY + ["--launcher", "mpirun"], "--launcher")
    add("signal-kill", SITE + DRY + ["--signal", "KILL"], "--signal")
    add("lead-over-time", SITE + DRY + ["--signal-lead", "7200"], "--signal-lead")
    add("container-no-runtime", SITE + DRY + ["--container", "pt.sif"], "--container")
    add("dryrun-and-emit", SITE + DRY + ["--emit", "{T}/job.sbatch"], "--emit")
    add("emit-empty", SITE + ["--nodes", "1", "--emit", ""], "--emit")
    add("emit-space", SITE + ["--nodes", "1", "--emit", " "], "--emit")
    add("emit-twice", SITE + ["--nodes", "1", "--emit", "{T}/a", "--emit", "{T}/b"], "--emit")
    add("emit-unwritable", SITE + ["--nodes", "1", "--emit", "/proc/nope/job.sbatch"], "--emit")
    add("wait-dryrun", SITE + DRY + ["--wait"], "--wait")
    add("wait-emit-empty", SITE + ["--nodes", "1", "--wait", "--emit", "{T}/j"], "--wait")
    add("unknown-flag", SITE + DRY + ["--nodez", "2"], "--nodez")
    add("nodes-twice", SITE + DRY + ["--nodes", "2"], "--nodes")
    add("site-twice", SITE + DRY + ["--site", "ib-h200"], "--site")
    add("site-empty", ["--site", ""] + DRY, "--site")
    add("site-nosuch", ["--site", "nosuch"] + DRY, "nosuch")
    add("site-path-missing", ["--site", "{T}/missing.yaml"] + DRY, "does not exist")
    add("site-dir", ["--site", "{T}/adir/"] + DRY, "directory", files={**SCRIPT, "adir/x": ""})
    add("site-huge-name", ["--site", "s" * 100_000] + DRY, "site")
    add("site-fifo", ["--site", "{T}/p.yaml"] + DRY, "regular file", files={**SCRIPT, "p.yaml": FIFO})
    add("m-without-module", SITE + DRY, "-m", rank=("--", "-m"))
    add("script-missing", SITE + DRY, "does not exist", rank=("--", "{T}/nosuch.py"))
    add("rank-args-only-dash", SITE + DRY, "-x", rank=("--", "-x"))
    add("rank-non-utf8", SITE + DRY, "UTF-8", rank=("--", "{T}/s.py", "a\udcffb"))
    add("sweep-not-trainer", SITE + DRY + ["--sweep", "seed=1,2"], "--sweep")
    tiny = ("--", "--config", TINY)
    for cid, flags, names in (
        ("sweep-not-a-key", ["--sweep", "optim.lrr=1e-4,3e-4"], "--sweep optim.lrr"),
        ("sweep-empty", ["--sweep", "optim.lr="], "--sweep"),
        ("sweep-empty-item", ["--sweep", "optim.lr=1e-4,"], "--sweep"),
        ("sweep-twice", ["--sweep", "optim.lr=1e-4", "--sweep", "optim.lr=3e-4"], "given twice"),
        ("sweep-bad-combo", ["--sweep", "parallel.tp=1,3"], "parallel.tp"),
        ("sweep-inf", ["--sweep", "optim.lr=1e-4,inf"], "optim.lr"),
        ("sweep-own-dir", ["--sweep", "log.dir=a,b"], "log.dir"),
        ("max-parallel-alone", ["--max-parallel", "2"], "--max-parallel"),
        ("after-malformed", ["--after", "12x"], "--after"),
        ("after-kind", ["--after", "12:later"], "--after"),
        ("after-zero", ["--after", "0"], "--after"),
        ("after-wraps", ["--after", "8589934613"], "--after"),
        ("after-2-32", ["--after", str(2**32)], "--after"),
        ("after-neg", ["--after", "-5"], "--after"),
        ("after-empty", ["--after", ""], "--after"),
        ("after-task-wraps", ["--after", "12_8589934613"], "--after"),
        ("after-leading-zero", ["--after", "012"], "--after"),
        ("after-unicode", ["--after", UNICODE_DIGIT], "--after"),
        ("after-newline", ["--after", "12\n"], "--after"),
        ("config-twice", [], "--config"),
    ):
        add(cid, SITE + DRY + flags, names, rank=tiny + (("--config", TINY) if cid == "config-twice" else ()))
    for cid, n in (
        ("name-empty", ""),
        ("name-newline", "a\nb"),
        ("name-backslash", "a\\b"),
        ("name-esc", "a\x1b[31mred"),
        ("name-201", "y" * 201),
        ("name-nul-like", "a\x7fb"),
        ("name-non-utf8", "caf\udce9"),
        ("name-huge", "n" * 100_000),
        ("name-cr", "a\rb"),
        ("name-tab", "a\tb"),
    ):
        add(cid, SITE + DRY + ["--job-name", n], "--job-name" if cid != "name-non-utf8" else "UTF-8")
    # trainer arguments after --, checked at submit time, on every shipped site
    train_bad = [
        ("train-flag", ["--lr", "1e-3"], "--lr"),
        ("train-unknown-key", ["optim.lrr=1e-3"], "optim.lrr"),
        ("train-neg-lr", ["optim.lr=-1"], "optim.lr"),
        ("train-inf-lr", ["optim.lr=inf"], "optim.lr"),
        ("train-e400-lr", ["optim.lr=1e400"], "optim.lr"),
        ("train-dotinf-wd", ["optim.weight_decay=.inf"], "optim.weight_decay"),
        ("train-nan-clip", ["grad_clip=.nan"], "grad_clip"),
        ("train-octal-steps", ["steps=010"], "steps"),
        ("train-true-steps", ["steps=true"], "steps"),
        ("train-comment", ["steps= #1"], "steps"),
        ("train-sexagesimal", ["seq_len=1:30"], "seq_len"),
        ("train-tilde", ["data.tokenizer=~"], "data.tokenizer"),
        ("train-tp3", ["parallel.tp=3"], "parallel.tp"),
        ("train-config-missing", ["--config", "{T}/nosuch.yaml"], "nosuch.yaml"),
        ("train-config-dir", ["--config", "{T}"], "--config"),
        ("train-config-fifo", ["--config", "{T}/fifo"], "--config"),
        ("train-batch", ["global_batch=0"], "global_batch"),
        ("train-shape", ["model.shape=70B"], "model.shape"),
        ("train-data-missing", ["data.path={T}/nosuch.jsonl"], "data.path"),
        ("train-data-suffix", ["data.path={T}/d.csv"], "data.path"),
        ("train-tokenizer-missing", ["data.tokenizer={T}/notok"], "tokenizer"),
        ("train-tokenizer-broken", ["data.tokenizer={T}/tok"], "tokenizer"),
        ("train-log-owned", ["log.dir={T}/owned"], "log.dir"),
    ]
    files = {
        "owned/.owner.json": json.dumps({"job_name": "someone-else"}),
        "d.csv": "text\nhello\n",
        "tok/tokenizer.json": "{broken",
        "fifo": FIFO,
    }
    sites = {
        "local": ["--site", "local", "--nodes", "2"],
        "ib-h200": ["--site", "ib-h200", "--nodes", "2"],
        "eth-a100": ["--site", "eth-a100", "--nodes", "1"],
        "roce-h100": ["--site", "roce-h100", "--nodes", "1"],
    }
    for sname, sflags in sites.items():
        for cid, targs, names in train_bad:
            if sname != "local" and cid not in (
                "train-flag",
                "train-tp3",
                "train-data-missing",
                "train-log-owned",
                "train-inf-lr",
                "train-octal-steps",
            ):
                continue
            fit = ["global_batch=32"] if sname == "ib-h200" else []  # the demo config's batch over 16 ranks
            c.append(
                Case(f"submit-{sname}-{cid}", SUBMIT, sflags + ["--dry-run", "--"] + targs + fit, names, files=files)
            )
    for sname, sflags in sites.items():
        fit = ["global_batch=32"] if sname == "ib-h200" else []
        c.append(
            Case(f"submit-{sname}-train-ok", SUBMIT, sflags + ["--dry-run", "--", "optim.lr=1e-3", *fit], expect="ok")
        )
    # hostile but valid job names: carried exactly into the script
    hostile = {
        "name-shell": "a$(touch {T}/pwned)`id`;rm -rf ~ &|<>",
        "name-quotes": "it's \"quoted\" 'twice'",
        "name-dollar": "$HOME ${PATH} $1 $$",
        "name-200": "y" * 200,
        "name-unicode": "\u8bad\u7ec3-\u03bb-\U0001f680",
        "name-dash": "-leading-dash",
        "name-sbatch": "x\u2028#SBATCH --qos=high",
    }
    for cid, n in hostile.items():
        c.append(
            Case(
                f"submit-{cid}",
                SUBMIT,
                SITE + ["--nodes", "1", "--emit", "{T}/job.sbatch", f"--job-name={n}"] + RANK,
                files=SCRIPT,
                expect="ok",
                check=exported("HPC_JOB_NAME", n),
            )
        )
    return c


# ---------------------------------------------------------------- site profiles


def site_cases() -> list[Case]:
    c: list[Case] = []
    run = ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run", "--", "{T}/s.py"]

    def bad(cid, text, names=None):
        c.append(Case(f"site-{cid}", SUBMIT, run, names, files={"p.yaml": text, **SCRIPT}))

    def ok(cid, text):
        c.append(Case(f"site-{cid}", SUBMIT, run, files={"p.yaml": text, **SCRIPT}, expect="ok"))

    ok("baseline", site_yaml())
    bad("binary", b"\x00\x01\x02\xff\xfe" * 20, "p.yaml")
    bad("latin1", "name: caf\xe9\n".encode("latin-1"), "UTF-8")
    bad("empty", "", "p.yaml")
    bad("list-top", "- a\n- b\n", "mapping")
    bad("bad-yaml", "name: [unclosed\n", "YAML")
    bad("python-tag", "name: !!python/object/apply:os.system ['true']\n", "YAML")
    bad("dup-top-key", site_yaml() + "name: other\n", "twice")
    bad(
        "dup-nested-key",
        site_yaml().replace("  fabric: ethernet\n", "  fabric: ethernet\n  fabric: infiniband\n"),
        "fabric",
    )
    bad("alias", site_yaml() + "description: &d x\nx: *d\n", "alias")
    bad(
        "alias-bomb",
        "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n",
        "alias",
    )
    bad("deep", "name: " + "[" * 300 + "]" * 300 + "\n", "p.yaml")
    bad("unknown-top", site_yaml(nmae="x"), "nmae")
    bad("missing-name", site_yaml(name=DELETE), "name")
    bad("name-slash", site_yaml(name="a/b"), "name")
    bad("name-newline", site_yaml(name="local\n"), "name")
    bad("name-huge", site_yaml(name="n" * 100_000), "name")
    bad("partitions-empty", site_yaml(partitions=[]), "partitions")
    P = "partitions__0__"
    for cid, key, val in (
        ("part-max-nodes-0", "max_nodes", 0),
        ("part-gpus-0", "gpus_per_node", 0),
        ("part-time-bad", "max_time", "two hours"),
        ("part-time-int", "max_time", 120),
        ("part-unknown-key", "max_gpus", 3),
        ("part-name-newline", "name", "debug\n"),
        ("part-gpu-type-newline", "gpu_type", "a100\n"),
        ("part-max-nodes-true", "max_nodes", True),
        ("part-max-nodes-float", "max_nodes", 2.5),
        ("part-mem-half", "mem_per_node_gb", 0.5),
        ("part-mem-fraction", "mem_per_node_gb", 3.7),
        ("part-mem-0", "mem_per_node_gb", 0),
        ("part-mem-neg", "mem_per_node_gb", -3),
        ("part-cpus-true", "cpus_per_node", True),
    ):
        bad(cid, site_yaml(**{P + key: val}), key)
    for key in ("max_nodes", "gpus_per_node", "cpus_per_node", "gpu_memory_gb", "mem_per_node_gb"):
        for vid, text in NON_FINITE.items():
            bad(f"part-{key}-{vid}", with_text(site_yaml(**{P + key: PLACE}), text), key)
    two = [dict(BASE_SITE["partitions"][0]), dict(BASE_SITE["partitions"][1])]
    bad("part-dup-names", site_yaml(partitions=[two[0], {**two[1], "name": "debug"}]), "repeat")
    bad("part-two-defaults", site_yaml(partitions=[two[0], {**two[1], "default": True}]), "default")
    N = "network__"
    for cid, key, val in (
        ("net-fabric", "fabric", "myrinet"),
        ("net-nccl-trailing-comma", "nccl_socket_ifname", "eth0,"),
        ("net-nccl-newline", "nccl_socket_ifname", "eth0\n"),
        ("net-nccl-space", "nccl_socket_ifname", " eth0"),
        ("net-gloo-caret", "gloo_socket_ifname", "^lo"),
        ("net-gloo-newline", "gloo_socket_ifname", "eth0\nrm"),
        ("net-gloo-trailing-newline", "gloo_socket_ifname", "eth0\n"),
        ("net-expected-neg", "expected", {"intra_node_gbps": -5}),
        ("net-roce-gid-neg", "roce_gid_index", -1),
    ):
        bad(cid, site_yaml(**{N + key: val}), key if key != "expected" else "intra_node_gbps")
    for key in ("intra_node_gbps", "inter_node_gbps"):
        for vid, text in NON_FINITE.items():
            bad(f"net-{key}-{vid}", with_text(site_yaml(**{f"network__expected__{key}": PLACE}), text), key)
    ib = {"network__fabric": "infiniband"}
    for cid, hcas in (
        ("ib-hca-caret", ["^mlx5_0"]),
        ("ib-hca-eq-late", ["mlx5_0", "=mlx5_1"]),
        ("ib-hca-comma-item", ["mlx5_0,mlx5_1"]),
        ("ib-hca-newline", ["mlx5_0\n"]),
    ):
        bad(cid, site_yaml(**ib, network__ib_hca=hcas), "ib_hca")
    bad("ib-hca-and-exclude", site_yaml(**ib, network__ib_hca=["mlx5_0"], network__ib_hca_exclude=["mlx5_1"]), "ib_hca")
    bad("ethernet-with-hca", site_yaml(network__ib_hca=["mlx5_0"]), "ethernet")
    bad("roce-no-gid", site_yaml(network__fabric="roce"), "roce_gid_index")
    ok("ib-hca-ports", site_yaml(**ib, network__ib_hca=["=mlx5_0:1", "mlx5_1:1"]))
    for cid, env in (
        ("extra-env-dash", {"NCCL-DEBUG": "INFO"}),
        ("extra-env-shell", {"A;id": "x"}),
        ("extra-env-newline", {"NCCL_DEBUG\n": "INFO"}),
        ("extra-env-int-value", {"NCCL_DEBUG": 3}),
    ):
        bad(cid, site_yaml(network__extra_env=env), "extra_env")
    for cid, key, val in (
        ("env-var-dash", "variables", {"MY-VAR": "1"}),
        ("env-var-newline", "variables", {"MY_VAR\n": "1"}),
        ("env-container-moved", "container", {"image": "x.sqsh"}),
        ("env-unknown", "conda", "train"),
        ("env-module-newline", "modules", ["cuda\nrm -rf /"]),
        ("env-module-trailing-newline", "modules", ["cuda\n"]),
    ):
        bad(
            cid,
            site_yaml(**{"environment__" + key: val}),
            "environment" if cid != "env-container-moved" else "container",
        )
    for cid, section, names in (
        ("container-runtime", {"runtime": "docker", "image": "x"}, "container.runtime"),
        ("container-no-sif", {"runtime": "apptainer", "image": "/no/such.sif"}, "/no/such.sif"),
        ("container-mount", {"runtime": "pyxis", "image": "x", "mounts": ["/a:/b:rw"]}, "container.mounts"),
        ("container-mount-newline", {"runtime": "pyxis", "image": "x", "mounts": ["/a:/b\n"]}, "container.mounts"),
        (
            "container-mount-ro-newline",
            {"runtime": "pyxis", "image": "x", "mounts": ["/a:/b:ro\n"]},
            "container.mounts",
        ),
        ("container-image-newline", {"runtime": "pyxis", "image": "x\n"}, "container.image"),
        ("container-python-newline", {"runtime": "pyxis", "image": "x", "python": "python\n"}, "container.python"),
        ("container-noimage", {"runtime": "pyxis"}, "image"),
        ("container-placeholder", {"runtime": "command", "command": ["x", "{imag}"]}, "{imag}"),
    ):
        bad(cid, site_yaml(container=section), names)
    for cid, opts, names in (
        ("sbatch-upper", {"Constraint": "a100"}, "Constraint"),
        ("sbatch-dashes", {"--constraint": "x"}, "--constraint"),
        ("sbatch-newline", {"constraint": "a\n#SBATCH --qos=high"}, "constraint"),
        ("sbatch-trailing-newline", {"constraint": "a100\n"}, "constraint"),
        ("sbatch-key-newline", {"constraint\n": "a100"}, "constraint"),
        ("sbatch-wrap", {"wrap": "id"}, "wrap"),
        ("sbatch-mem-per-gpu", {"mem-per-gpu": "1G"}, "mem-per-gpu"),
        ("sbatch-mem-per-cpu", {"mem-per-cpu": "1G"}, "mem-per-cpu"),
        ("sbatch-int", {"nice": 5}, "nice"),
    ):
        bad(cid, site_yaml(submission__extra_sbatch=opts), names)
    for cid, key, val in (
        ("account-newline", "account", "acct\n"),
        ("qos-newline", "qos", "high\n#SBATCH -p x"),
        ("account-int", "account", 123),
    ):
        bad(cid, site_yaml(**{"submission__" + key: val}), key)
    ok("sbatch-hostile-value", site_yaml(submission__extra_sbatch={"comment": "a b 'q' \"d\" $(id) ;"}))
    for cid, key, val in (
        ("pre-signal-kill", "signal", "KILL"),
        ("pre-lead-5", "lead_s", 5),
        ("pre-lead-over-limit", "lead_s", 7200),
        ("pre-lead-float", "lead_s", 60.5),
        ("pre-requeues-neg", "max_requeues", -1),
        ("pre-requeues-true", "max_requeues", True),
    ):
        bad(cid, site_yaml(**{"preemption__" + key: val}), key if cid != "pre-lead-over-limit" else "lead")
    for key in ("lead_s", "max_requeues"):
        for vid, text in NON_FINITE.items():
            bad(f"pre-{key}-{vid}", with_text(site_yaml(**{f"preemption__{key}": PLACE}), text), key)
    for cid, key, val in (
        ("restart-spares-neg", "spare_nodes", -1),
        ("restart-spares-true", "spare_nodes", True),
        ("restart-spares-float", "spare_nodes", 1.5),
        ("restart-max-neg", "max_restarts", -1),
        ("restart-per-node-zero", "max_restarts_per_node", 0),
        ("restart-per-node-text", "max_restarts_per_node", "1"),
        ("restart-unknown", "spares", 1),
    ):
        bad(cid, site_yaml(**{"restart__" + key: val}), key)
    bad("restart-spares-over-partition", site_yaml(restart__spare_nodes=4), "restart.spare_nodes")
    for cid, key, val in (
        ("path-unset-var", "job_dir", "$NO_SUCH_VAR_XYZ/jobs"),
        ("path-newline", "job_dir", "{T}/a\nb"),
        ("path-trailing-newline", "checkpoint_root", "{T}/c\n"),
        ("path-nul", "job_dir", "{T}/a\0b"),
    ):
        c.append(
            Case(
                f"site-{cid}",
                SUBMIT,
                run,
                "NO_SUCH_VAR_XYZ" if cid == "path-unset-var" else ("NUL" if "nul" in cid else key),
                files={"p.yaml": site_yaml(**{"paths__" + key: val}), **SCRIPT},
            )
        )
    ok("path-hostile", site_yaml(paths__job_dir="{T}/j o b s;$(id)"))
    emit_run = ["--site", "{T}/p.yaml", "--nodes", "1", "--emit", "{T}/job.sbatch", "--", "{T}/s.py"]
    c.append(
        Case(
            "site-path-under-file",
            SUBMIT,
            emit_run,
            "job_dir",
            files={"p.yaml": site_yaml(paths__job_dir="{T}/afile/jobs"), "afile": "x", **SCRIPT},
        )
    )
    hv = "$(touch {T}/pwned) `id` 'q' \"d\" \\ $HOME"
    for cid, text, var, want in (
        ("env-var-newline-value", site_yaml(environment__variables={"MYA": "x\ny"}), "MYA", "x\ny"),
        ("env-var-hostile-value", site_yaml(environment__variables={"MYV": hv}), "MYV", hv),
        ("extra-env-hostile-value", site_yaml(network__extra_env={"NCCL_X": hv}), "NCCL_X", hv),
    ):
        c.append(
            Case(
                f"site-{cid}",
                SUBMIT,
                emit_run,
                files={"p.yaml": text, **SCRIPT},
                expect="ok",
                check=exported(var, want),
            )
        )
    plan = ["--site", "{T}/p.yaml", "--nodes", "1", "--model", "8B"]
    c.append(
        Case(
            "site-training-config-missing",
            SUBMIT,
            ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run"],
            "training.config",
            files={"p.yaml": site_yaml(training__config="{T}/nosuch.yaml")},
        )
    )
    c.append(
        Case(
            "site-training-config-name",
            SUBMIT,
            ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run"],
            "nosuchcfg",
            files={"p.yaml": site_yaml(training__config="nosuchcfg")},
        )
    )
    c.append(
        Case(
            "site-training-config-bad",
            SUBMIT,
            ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run"],
            "steps",
            files={"p.yaml": site_yaml(training__config="{T}/c.yaml"), "c.yaml": cfg_yaml({"steps": 0})},
        )
    )
    c.append(Case("site-plan-bad-key", "hpc.plan", plan, "bogus", files={"p.yaml": site_yaml(bogus=1)}))
    c.append(
        Case(
            "site-plan-gpumem-inf",
            "hpc.plan",
            plan,
            "gpu_memory_gb",
            files={"p.yaml": site_yaml(partitions__0__gpu_memory_gb=float("inf"))},
        )
    )
    return c


# ---------------------------------------------------------------- hpc.plan, hpc.preflight, hpc.jobs, node programs


def plan_cases() -> list[Case]:
    base = ["--site", "ib-h200"]
    c = [
        Case(f"plan-{cid}", "hpc.plan", base + args, names)
        for cid, args, names in (
            ("model-tiny", ["--nodes", "1", "--model", "tiny"], "--model"),
            ("model-70B", ["--nodes", "1", "--model", "70B"], "--model"),
            ("model-missing", ["--nodes", "1"], "--model"),
            ("nodes-over-max", ["--nodes", "65", "--model", "8B"], "--nodes"),
            ("gpus-16", ["--nodes", "1", "--model", "8B", "--gpus-per-node", "16"], "--gpus-per-node"),
            ("gpus-0", ["--nodes", "1", "--model", "8B", "--gpus-per-node", "0"], "--gpus-per-node"),
            ("dtype-fp16", ["--nodes", "1", "--model", "8B", "--master-dtype", "fp16"], "--master-dtype"),
            ("partition-nosuch", ["--nodes", "1", "--model", "8B", "--partition", "cpu"], "partition"),
            ("no-fit", ["--nodes", "1", "--model", "32B", "--seq-len", "131072", "--micro-batch", "8"], "does not fit"),
            ("model-twice", ["--nodes", "1", "--model", "8B", "--model", "4B"], "--model"),
            ("global-batch-0", ["--nodes", "1", "--model", "8B", "--global-batch", "0"], "--global-batch"),
            ("global-batch-huge", ["--nodes", "1", "--model", "8B", "--global-batch", "1e9"], "--global-batch"),
            (
                "global-batch-over",
                ["--nodes", "1", "--model", "8B", "--global-batch", str(2**24 + 1)],
                "--global-batch",
            ),
        )
    ]
    c.append(
        Case("plan-site-no-gpumem", "hpc.plan", ["--site", "local", "--nodes", "1", "--model", "8B"], "gpu_memory_gb")
    )
    c.append(Case("plan-site-nosuch", "hpc.plan", ["--site", "nosuch", "--nodes", "1", "--model", "8B"], "nosuch"))
    c.append(Case("plan-site-empty", "hpc.plan", ["--site", "", "--nodes", "1", "--model", "8B"], "--site"))
    c.append(Case("plan-ok-8B", "hpc.plan", base + ["--nodes", "2", "--model", "8B"], expect="ok"))
    return c


def preflight_cases() -> list[Case]:
    base = ["--site", "local"]
    c = [
        Case(f"preflight-{cid}", "hpc.preflight", base + args, names)
        for cid, args, names in (
            ("minfrac-0", ["--nodes", "1", "--min-fraction", "0"], "--min-fraction"),
            ("minfrac-1.5", ["--nodes", "1", "--min-fraction", "1.5"], "--min-fraction"),
            ("bytes-order", ["--nodes", "1", "--min-bytes", "1000", "--max-bytes", "10"], "--min-bytes"),
            ("out-empty", ["--nodes", "1", "--out", ""], "--out"),
            ("out-space", ["--nodes", "1", "--out", "  "], "--out"),
            ("out-twice", ["--nodes", "1", "--out", "a", "--out", "b"], "--out"),
            ("nodes-5", ["--nodes", "5"], "--nodes"),
            ("partition-nosuch", ["--nodes", "1", "--partition", "gpu"], "partition"),
        )
    ]
    c.append(
        Case(
            "preflight-out-under-file",
            "hpc.preflight",
            base + ["--nodes", "1", "--out", "{T}/afile/out", "--time", "3"],
            "--out",
            files={"afile": "x"},
        )
    )
    c.append(Case("preflight-node-out-empty", "hpc.node.preflight_node", ["--out", ""], "--out"))
    c.append(Case("smoke-out-empty", "hpc.node.smoke", ["--out", ""], "--out"))
    return c


JOB_IDS = {
    "abc": "abc",
    "neg": "-5",
    "empty": "",
    "zero": "0",
    "huge": "99999999999999999999",
    "wraps": "8589934613",
    "2-32": str(2**32),
    "shell": "1;id",
    "step": "99999999.batch",
    "unicode": UNICODE_DIGIT,
    "space": " 12",
    "newline": "12\n",
    "leading-zero": "012",
    "task-neg": "12_-1",
    "task-wraps": "12_4294967296",
    "task-empty": "12_",
    "double-task": "12_3_4",
    "long": HUGE,
}


def jobs_cases() -> list[Case]:
    c: list[Case] = []
    for sub in ("status", "logs", "report", "cancel"):
        for cid, jid in JOB_IDS.items():
            c.append(Case(f"jobs-{sub}-{cid}", "hpc.jobs", [sub, jid], "job"))
    c.append(Case("jobs-no-sub", "hpc.jobs", [], "command"))
    c.append(Case("jobs-bad-sub", "hpc.jobs", ["kill", "1"], "kill"))
    c.append(Case("jobs-status-missing", "hpc.jobs", ["status"], "job"))
    for cid, out in (
        ("xyz", "r.xyz"),
        ("none", "report"),
        ("empty", ""),
        ("dir-missing", "{T}/no/such/r.png"),
        ("txt", "r.txt"),
    ):
        c.append(Case(f"jobs-report-out-{cid}", "hpc.jobs", ["report", "12", "--out", out], "--out"))
    c.append(Case("jobs-report-tensorboard-empty", "hpc.jobs", ["report", "12", "--tensorboard", ""], "--tensorboard"))
    c.append(Case("jobs-report-out-twice", "hpc.jobs", ["report", "12", "--out", "a.png", "--out", "b.png"], "--out"))
    c.append(Case("jobs-logs-rank-twice", "hpc.jobs", ["logs", "12", "--rank", "1", "--rank", "2"], "--rank"))
    return c


def launch_cases() -> list[Case]:
    c: list[Case] = []

    def add(cid, env, names=None, args=("--", "true"), **kw):
        c.append(Case(f"launch-{cid}", "hpc.node.launch", list(args), names, env={**SRUN_ENV, **env}, **kw))

    short = {
        "SLURM_NTASKS": "NUM_TASKS",
        "SLURM_JOB_NUM_NODES": "NUM_NODES",
        "SLURM_JOB_NODELIST": "NODELIST",
        "SLURM_TASKS_PER_NODE": "TASKS_PER_NODE",
    }
    for var in SRUN_ENV:
        if var != "SLURM_GPUS_ON_NODE":
            add(f"missing-{var}", {var: None}, short.get(var, var))
    for var in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_NUM_NODES"):
        for cid, val in (
            ("abc", "abc"),
            ("neg", "-1"),
            ("float", "1.0"),
            ("underscore", "1_0"),
            ("space", " 1"),
            ("unicode-digit", UNICODE_DIGIT),
            ("huge", HUGE),
        ):
            add(f"{var}-{cid}", {var: val}, var)
    for cid, env, names in (
        ("jobid-12_3", {"SLURM_JOB_ID": "12_3"}, "SLURM_JOB_ID"),
        ("jobid-empty", {"SLURM_JOB_ID": ""}, "SLURM_JOB_ID"),
        ("procid-ge-ntasks", {"SLURM_PROCID": "4"}, "SLURM_PROCID"),
        ("localid-ge-local", {"SLURM_LOCALID": "2"}, "SLURM_LOCALID"),
        ("nodeid-ge-nnodes", {"SLURM_NODEID": "2"}, "SLURM_NODEID"),
        ("ntasks-0", {"SLURM_NTASKS": "0"}, "tasks"),
        ("nnodes-0", {"SLURM_JOB_NUM_NODES": "0"}, "nodes"),
        ("ntasks-not-fill", {"SLURM_NTASKS": "3"}, "tasks"),
        ("tpn-uneven", {"SLURM_TASKS_PER_NODE": "2,1", "SLURM_NTASKS": "3"}, "tasks per node"),
        ("tpn-garbage", {"SLURM_TASKS_PER_NODE": "2(x2"}, "SLURM_TASKS_PER_NODE"),
        ("tpn-letters", {"SLURM_TASKS_PER_NODE": "two"}, "SLURM_TASKS_PER_NODE"),
        ("tpn-zero-repeat", {"SLURM_TASKS_PER_NODE": "2(x0)"}, "SLURM_TASKS_PER_NODE"),
        ("tpn-node-count-mismatch", {"SLURM_TASKS_PER_NODE": "2(x3)"}, "SLURM_TASKS_PER_NODE"),
        ("tpn-huge", {"SLURM_TASKS_PER_NODE": HUGE}, "SLURM_TASKS_PER_NODE"),
        ("gpus-mismatch", {"SLURM_GPUS_ON_NODE": "4"}, "GPUs"),
        ("gpus-abc", {"SLURM_GPUS_ON_NODE": "all"}, "SLURM_GPUS_ON_NODE"),
        ("restart-abc", {"SLURM_RESTART_COUNT": "x"}, "SLURM_RESTART_COUNT"),
        ("restart-neg", {"SLURM_RESTART_COUNT": "-1"}, "SLURM_RESTART_COUNT"),
        ("nodelist-bad", {"SLURM_JOB_NODELIST": "n[1-"}, "SLURM_JOB_NODELIST"),
        ("nodelist-reversed", {"SLURM_JOB_NODELIST": "n[3-1]"}, "SLURM_JOB_NODELIST"),
        ("nodelist-comma-only", {"SLURM_JOB_NODELIST": ","}, "SLURM_JOB_NODELIST"),
        ("nodelist-too-few", {"SLURM_JOB_NODELIST": "n1"}, "SLURM_JOB_NODELIST"),
        ("nodelist-huge-range", {"SLURM_JOB_NODELIST": "n[1-999999999999]"}, "SLURM_JOB_NODELIST"),
        ("step-over-job", {"SLURM_STEP_NUM_TASKS": "x"}, "SLURM_STEP_NUM_TASKS"),
        ("gloo-nosuch", {"GLOO_SOCKET_IFNAME": "nosuch0"}, "GLOO_SOCKET_IFNAME"),
        ("gloo-list-one-bad", {"GLOO_SOCKET_IFNAME": "lo,nosuch0"}, "nosuch0"),
        ("gloo-caret", {"GLOO_SOCKET_IFNAME": "^lo"}, "GLOO_SOCKET_IFNAME"),
        ("nccl-nosuch", {"NCCL_SOCKET_IFNAME": "nosuch"}, "NCCL_SOCKET_IFNAME"),
        ("nccl-exact-nosuch", {"NCCL_SOCKET_IFNAME": "=eth"}, "NCCL_SOCKET_IFNAME"),
        ("nccl-exclude-all", {"NCCL_SOCKET_IFNAME": "^e,l,i,s,d,v,w,b,t"}, "NCCL_SOCKET_IFNAME"),
        ("nccl-garbage", {"NCCL_SOCKET_IFNAME": "^^"}, "NCCL_SOCKET_IFNAME"),
        ("nccl-newline", {"NCCL_SOCKET_IFNAME": "lo\n"}, "NCCL_SOCKET_IFNAME"),
        ("ib-hca-nosuch", {"NCCL_IB_HCA": "mlx5_0"}, "NCCL_IB_HCA"),
        ("ib-hca-port-bad", {"NCCL_IB_HCA": "mlx5_0:x"}, "NCCL_IB_HCA"),
        ("ib-hca-port-unicode", {"NCCL_IB_HCA": "mlx5_0:" + UNICODE_DIGIT}, "NCCL_IB_HCA"),
    ):
        add(cid, env, names)
    add("no-command", {}, "command", args=["--"])
    add("launcher-bad", {}, "--launcher", args=["--launcher", "mpirun", "--", "true"])
    add("unknown-flag", {}, "--nodes", args=["--nodes", "2", "--", "true"])
    add("gpus-twice", {}, "--gpus-per-node", args=["--gpus-per-node", "2", "--gpus-per-node", "2", "--", "true"])
    add("torchrun-tasks", {}, "one task per node", args=["--launcher", "torchrun", "--", "true"])
    add("accelerate-tasks", {}, "one task per node", args=["--launcher", "accelerate", "--", "true"])
    add(
        "torchrun-no-gpus",
        {"SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_GPUS_ON_NODE": None},
        "--gpus-per-node",
        args=["--launcher", "torchrun", "--", "true"],
    )
    add("container-not-words", {}, "--container", args=["--container", "a 'b", "--", "true"])
    add("rank-and-container", {}, "--container", args=["--rank", "--container", "x", "--", "true"])
    return c


def generate_cases() -> list[Case]:
    c = [
        Case("generate-no-dir", "train.generate", ["{T}/nosuch"], "nosuch"),
        Case("generate-dir-empty-arg", "train.generate", [""], "model_dir"),
        Case("generate-not-model", "train.generate", ["{T}/m"], "config.json", files={"m/x": ""}),
        Case("generate-config-broken", "train.generate", ["{T}/m"], "{T}/m", files={"m/config.json": "{not json"}),
        Case("generate-config-no-type", "train.generate", ["{T}/m"], "{T}/m", files={"m/config.json": "{}"}),
        Case(
            "generate-no-weights",
            "train.generate",
            ["{T}/m"],
            "{T}/m",
            files={"m/config.json": json.dumps({"model_type": "qwen3"}), **TOKENIZER_FILES},
        ),
        Case("generate-prompt-and-chat", "train.generate", ["{T}/m", "--prompt", "a", "--chat", "b"], "--chat"),
        Case(
            "generate-empty-prompt",
            "train.generate",
            ["{T}/m", "--prompt", ""],
            "--prompt",
            files={"m/config.json": "{}"},
        ),
        Case(
            "generate-empty-chat", "train.generate", ["{T}/m", "--chat", " "], "--chat", files={"m/config.json": "{}"}
        ),
        Case("generate-tokens-twice", "train.generate", ["{T}/m", "--tokens", "2", "--tokens", "3"], "--tokens"),
        Case("generate-unknown-flag", "train.generate", ["{T}/m", "--temperature", "2"], "--temperature"),
    ]
    return c


TOKENIZER_FILES = {
    f"m/{p.name}": p.read_text() for p in (ROOT / "train" / "assets" / "tokenizer").iterdir() if p.is_file()
}

# ---------------------------------------------------------------- whole messages, once checked by the process tiers

SWEEP_BAD = [
    (
        ["--sweep", "optim.lrr=1e-4,3e-4"],
        "--sweep optim.lrr: not a config key (optim has: lr, betas, weight_decay, eps)",
    ),
    (["--sweep", "optim=1,2"], "--sweep optim: optim is a section, not a value"),
    (["--sweep", "optim.lr="], "--sweep 'optim.lr=': an empty value"),
    (["--sweep", "optim.lr=1", "--sweep", "optim.lr=2"], "--sweep optim.lr: given twice"),
    (["--sweep", "parallel.tp=1,3"], "--sweep task [1] parallel.tp=3: trainer: parallel.tp=3 must divide"),
    (["--max-parallel", "2"], "--max-parallel: limits the tasks of a sweep"),
    (["--sweep", "seed=1,2", "--max-parallel", "0"], "argument --max-parallel: 0 is out of range: allowed 1..100000"),
    (["--after", "12x"], "--after '12x': expected JOB[:ok|any|notok]"),
    (["--after", "12:later"], "'later' is not one of ok, any, notok"),
    (["--sweep", "seed=1,2", "--wait"], "--wait follows one job"),
]

SUBMIT_BAD = [
    (["--site", "nosuch", "--nodes", "1"], "site 'nosuch' not found"),
    (
        ["--site", "local", "--nodes", "1", "--partition", "gpu"],
        "--partition: site local: partition 'gpu' is not in the profile; allowed: debug, low, high",
    ),
    (["--site", "local", "--nodes", "5"], "--nodes 5: partition debug of site local has at most 4 nodes"),
    (
        ["--site", "local", "--nodes", "1", "--time", "3:00:00"],
        "--time 3:00:00: partition debug allows at most 02:00:00",
    ),
    (["--site", "local", "--nodes", "1", "--time", "soon"], "--time: time 'soon' is not a Slurm time"),
    (["--site", "local", "--nodes", "1", "--gpus-per-node", "3"], "--gpus-per-node 3: partition debug allows 1 to 2"),
    (["--site", "local", "--nodes", "1", "--", "missing.py"], "script missing.py does not exist"),
    (
        ["--site", "local", "--nodes", "1", "--signal", "KILL"],
        "--signal: signal 'KILL' is not allowed; allowed: USR1, USR2, TERM",
    ),
    (
        ["--site", "local", "--nodes", "1", "--time", "2", "--signal-lead", "120"],
        "--signal-lead 120: must be shorter than the time limit (120 s)",
    ),
    (
        ["--site", "local", "--nodes", "1", "--max-requeues", "-1"],
        "argument --max-requeues: -1 is out of range: allowed 0..100000",
    ),
    (
        ["--site", "local", "--nodes", "3", "--spare-nodes", "2"],
        "--spare-nodes 2: --nodes 3 + 2 spare(s) is 5 nodes; partition debug of site local has at most 4",
    ),
    (
        ["--site", "local", "--nodes", "2", "--spare-nodes", "1", "--nodelist", "n[1-4]"],
        "--nodelist 'n[1-4]' names 4 nodes; --nodes 2 + 1 spare(s): list at most 3 nodes",
    ),
    (
        ["--site", "local", "--nodes", "1", "--time", "UNLIMITED"],
        "--time UNLIMITED: partition debug allows at most 02:00:00",
    ),
    (
        ["--site", "local", "--nodes", "1", "--job-name", "a\\b"],
        "--job-name: a backslash cannot be given to Slurm exactly",
    ),
    (["--site", "local", "--nodes", "1", "--job-name", "n" * 201], "--job-name: 201 characters; at most 200"),
    (["--site", "local", "--nodes", "2", "--", "optim.lr=abc"], "trainer: "),
    (["--site", "local", "--nodes", "2", "--", "no.such.key=1"], "unknown key no"),
    (["--site", "local", "--nodes", "2", "--", "parallel.tp=3"], "trainer: parallel.tp=3 must divide"),
    (
        ["--site", "local", "--nodes", "2", "--", "--config", "/nonexistent.yaml"],
        "trainer: --config /nonexistent.yaml: cannot read (No such file or directory)",
    ),
    (["--site", "local", "--nodes", "2", "--", "--config"], "trainer: --config needs a file"),
    (["--site", "local", "--nodes", "1", "--", "/"], "trainer: trainer argument '/' is neither --config FILE nor"),
    (
        ["--site", "local", "--nodes", "2", "--", "data.path=/no/such.jsonl"],
        "trainer: data.path: /no/such.jsonl does not exist",
    ),
    (
        ["--site", "local", "--nodes", "2", "--", "data.tokenizer=/tmp"],
        "trainer: tokenizer: /tmp is not a Hugging Face tokenizer",
    ),
]


def message_cases() -> list[Case]:
    """Pure argument errors named by their whole message (the process tiers keep one process per command for the
    process's side: exit 2, one line, no traceback)."""
    c: list[Case] = []
    for i, (flags, message) in enumerate(SWEEP_BAD):  # --emit: nothing may be written; --wait: nothing submitted
        tail = [] if "--wait" in flags else ["--emit", "{T}/job.sbatch"]
        c.append(
            Case(
                f"msg-sweep-{i}",
                SUBMIT,
                ["--site", "local", "--nodes", "1", *flags, *tail, "--", "--config", TINY],
                message,
            )
        )
    for i, (args, message) in enumerate(SUBMIT_BAD):  # no --dry-run: past the checks it would submit
        c.append(Case(f"msg-submit-{i}", SUBMIT, args, message))
    c.append(
        Case(
            "msg-submit-launcher",
            SUBMIT,
            ["--site", "local", "--nodes", "2", "--launcher", "mpirun", "--", "x.py"],
            "hpc.submit: error: --launcher mpirun: allowed: srun, torchrun, accelerate",
        )
    )
    c.append(
        Case(
            "msg-submit-accelerate-script",
            SUBMIT,
            ["--site", "local", "--nodes", "2", "--launcher", "accelerate", "--", "nosuch.py"],
            "hpc.submit: error: script nosuch.py does not exist",
        )
    )
    c.append(
        Case(
            "msg-jobs-id", "hpc.jobs", ["status", "12x"], "hpc.jobs status: error: argument job: '12x' is not a job id"
        )
    )
    restart = ["--nodes", "2", "--tasks-per-node", "1", "--ranks", "2", "--marks", "{T}/m"]
    c.append(
        Case(
            "msg-restart-outside",
            "hpc.node.restart",
            restart + ["--", "srun", "true"],
            "hpc.node.restart: error: missing SLURM_JOB_ID, SLURM_JOB_NODELIST, HPC_JOB_DIR, HPC_STOP_RECORD: run this "
            "in "
            "the batch script of a job",
            env={"SLURM_JOB_ID": None, "SLURM_JOB_NODELIST": None, "HPC_JOB_DIR": None, "HPC_STOP_RECORD": None},
        )
    )
    c.append(
        Case(
            "msg-restart-no-srun",
            "hpc.node.restart",
            restart + ["--", "true"],
            "hpc.node.restart: error: give the srun command line after -- (see --help)",
        )
    )
    for i, (args, message) in enumerate(
        (
            (["--site", "local", "--nodes", "2", "--model", "8B"], "site local: partition debug has no gpu_memory_gb"),
            (["--site", "ib-h200", "--nodes", "2", "--model", "9B"], "--model 9B: allowed"),
            (
                ["--site", "ib-h200", "--nodes", "0", "--model", "8B"],
                "argument --nodes: 0 is out of range: allowed 1..100000",
            ),
        )
    ):
        c.append(Case(f"msg-plan-{i}", "hpc.plan", args, message))
    for i, (args, message) in enumerate(
        (
            (["--nodes", "5"], "--nodes 5: partition debug of site local has at most 4 nodes"),
            (["--nodes", "1", "--min-fraction", "2"], "argument --min-fraction: 2 is out of range: allowed (0, 1]"),
            (
                ["--nodes", "1", "--min-bytes", "4096", "--max-bytes", "1024"],
                "--min-bytes 4096 is larger than --max-bytes 1024",
            ),
        )
    ):
        c.append(Case(f"msg-preflight-{i}", "hpc.preflight", ["--site", "local", *args], message))
    # a partition without GPUs (gpu_request: none) has nothing for the GPU health checks, before anything is submitted
    cpu = ["--site", str(ROOT / "tests" / "sites" / "local-forms.yaml"), "--partition", "cpu", "--nodes", "1"]
    why = (
        "partition cpu of site local-forms has no GPUs (gpu_request: none); the GPU health checks need a GPU "
        "partition: debug, low"
    )
    c.append(Case("msg-preflight-cpu-partition", "hpc.preflight", cpu, f"--partition: {why}"))
    c.append(
        Case(
            "msg-submit-preflight-cpu", SUBMIT, [*cpu, "--preflight", "--dry-run", *RANK], f"--preflight: {why}", SCRIPT
        )
    )
    # the trainer's layout, from the environment torchrun gives rank 1, before any process group
    for i, (world, local, local_rank, overrides, message) in enumerate(
        (
            (
                4,
                4,
                1,
                ["parallel.tp=4"],
                "parallel.tp=4 must divide the model's num_key_value_heads=2 (allowed: [1, 2])",
            ),
            (4, 4, 1, ["parallel.dp=3", "parallel.tp=1"], "parallel.dp=3 x parallel.tp=1 = 3 must equal WORLD_SIZE=4"),
            (4, 1, 0, ["parallel.tp=2"], "parallel.tp=2 must divide the ranks per node LOCAL_WORLD_SIZE=1"),
            (4, 4, 1, ["parallel.cp=3"], "parallel.cp=3 must divide seq_len=32"),
            (4, 4, 1, ["parallel.cp=8"], "parallel.cp=8 x parallel.tp=1 = 8 must divide WORLD_SIZE=4"),
            (4, 4, 1, ["model.shape=tiny-moe", "parallel.cp=2"], "parallel.cp=2 needs a dense model"),
            (4, 4, 1, ["data.pack=documents", "parallel.cp=2"], "parallel.cp=2 splits each sequence over ranks"),
            (4, 4, 1, ["optim.lrr=1"], "unknown key optim.lrr"),
            (1, 1, 0, [], "environment RANK=1: allowed 0 to 0 (WORLD_SIZE=1)"),
            (4, 8, 1, [], "environment LOCAL_WORLD_SIZE=8: allowed 1 to 4 (WORLD_SIZE=4)"),
            (4, 1, 1, [], "environment LOCAL_RANK=1: allowed 0 to 0 (LOCAL_WORLD_SIZE=1)"),
            (0, 1, 0, [], "environment WORLD_SIZE=0: allowed at least 1"),
        )
    ):
        env = {
            "RANK": "1",
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(local),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29995",
        }
        c.append(Case(f"msg-train-layout-{i}", "train", ["--config", TINY, *overrides], message, env=env))
    c.append(
        Case(
            "msg-train-fp8-cpu",
            "train",
            ["--config", TINY, "fp8.enabled=true", "log.dir={T}/log"],
            "train: error: fp8.enabled=true needs a CUDA GPU of compute capability 8.9 or newer (H100, H200, L40S, "
            "...); "
            "this run is on cpu",
        )
    )
    c.append(Case("msg-prepare-stream", "train.prepare", ["--config", TINY], "data.pack=stream"))
    c.append(
        Case(
            "msg-submit-slurm-conf-missing",
            SUBMIT,
            ["--site", "{T}/p.yaml", "--nodes", "1", "--time", "5", "--", "{T}/s.py"],
            "submission.slurm_conf /no/such/slurm.conf does not exist",
            env={"SLURM_CONF": None},
            files={"p.yaml": site_yaml(**{"submission.slurm_conf": "/no/such/slurm.conf"}), **SCRIPT},
        )
    )
    c.append(
        Case("msg-submit-emit-dir", SUBMIT, ["--site", "local", "--nodes", "1", "--emit", "{T}"], "Is a directory")
    )
    c.append(
        Case(
            "msg-submit-site-unset-var",
            SUBMIT,
            ["--site", "{T}/site.yaml", "--nodes", "1", "--dry-run"],
            "paths.job_dir: '$HPC_TEST_UNSET/jobs' uses $HPC_TEST_UNSET, which is not set",
            files={"site.yaml": site_yaml(**{"paths.job_dir": "$HPC_TEST_UNSET/jobs"})},
        )
    )
    return c


def site_form_cases() -> list[Case]:
    """The partitions' GPU request and binding keys and the libfabric fabrics' network keys."""
    c: list[Case] = []
    run = ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run", "--", "{T}/s.py"]

    def bad(cid, text, names):
        c.append(Case(f"site-{cid}", SUBMIT, run, names, files={"p.yaml": text, **SCRIPT}))

    P, N = "partitions__0__", "network__"
    for cid, key, val, names in (
        ("gpu-request", "gpu_request", "gpus-per-task", "gpu_request"),
        ("gpu-request-int", "gpu_request", 2, "gpu_request"),
        ("gpu-bind", "gpu_bind", "map_gpu:a,b", "gpu_bind"),
        ("gpu-bind-newline", "gpu_bind", "closest\n", "gpu_bind"),
        ("gpu-bind-shell", "gpu_bind", "closest; id", "gpu_bind"),
        ("cpu-bind", "cpu_bind", "socket", "cpu_bind"),
        ("cpu-bind-list", "cpu_bind", ["none"], "cpu_bind"),
        ("gres-flags", "gres_flags", ["bind-all"], "gres_flags"),
        ("gres-flags-string", "gres_flags", "enforce-binding", "gres_flags"),
        ("gres-flags-both", "gres_flags", ["enforce-binding", "disable-binding"], "exclude each other"),
        ("gres-flags-twice", "gres_flags", ["allow-task-sharing", "allow-task-sharing"], "twice"),
    ):
        bad(f"part-{cid}", site_yaml(**{P + key: val}), names)
    bad("part-cpu-with-gpu-type", site_yaml(**{P + "gpu_request": "none", P + "gpu_type": "a100"}), "gpu_type")
    bad("part-cpu-with-bind", site_yaml(**{P + "gpu_request": "none", P + "gpu_bind": "closest"}), "gpu_bind")
    for opt in ("gpu-bind", "cpu-bind", "gres-flags", "gpus-per-task"):
        bad(f"sbatch-{opt}", site_yaml(submission__extra_sbatch={opt: "x"}), opt)
    efa = {N + "fabric": "efa"}
    for cid, extra, names in (
        ("efa-with-hca", {N + "ib_hca": ["mlx5_0"]}, "ib_hca"),
        ("efa-with-gid", {N + "roce_gid_index": 3}, "roce_gid_index"),
        ("plugin-on-ethernet", {N + "nccl_net_plugin": "ofi"}, "nccl_net_plugin"),
        ("plugin-space", {**efa, N + "nccl_net_plugin": "lib nccl.so"}, "nccl_net_plugin"),
        ("plugin-newline", {**efa, N + "nccl_net_plugin": "ofi\n"}, "nccl_net_plugin"),
        ("rdma-on-slingshot", {N + "fabric": "slingshot", N + "efa_device_rdma": False}, "efa_device_rdma"),
        ("rdma-string", {**efa, N + "efa_device_rdma": "yes"}, "efa_device_rdma"),
        ("set-on-efa", {**efa, N + "slingshot_set": "site"}, "slingshot_set"),
        ("set-unknown", {N + "fabric": "slingshot", N + "slingshot_set": "hpe"}, "slingshot_set"),
        ("fabric-tcp", {N + "fabric": "tcp"}, "fabric"),
    ):
        bad(f"net-{cid}", site_yaml(**extra), names)
    return c


# ---------------------------------------------------------------- the features added last: LoRA, MoE, health, lease,
# integrations

LORA_ON = ["lora.enabled=true"]
LORA_KEYS = {
    "r": "8",
    "alpha": "16",
    "dropout": "0.1",
    "target_modules": "[q_proj]",
    "use_rslora": "true",
    "merge": "true",
    "quantize_base": "nf4",
}
LORA_BAD = {
    "r": ("0", "-1", "1.5", "true", "x", HUGE, ".inf", ".nan", "010"),
    "alpha": ("0", "-1", ".nan", ".inf", "-.inf", "true", "x"),
    "dropout": ("-0.1", "1", "1.5", ".nan", "true", "x"),
    "target_modules": ("x_proj", "[]", "[q_proj, q_proj]", "3", "[1]", "Q_PROJ", "{a: 1}"),
    "use_rslora": ("1", "yes", "on", "0"),
    "quantize_base": ("nf8", "true", "NF4", "int4"),
    "merge": ("1", "yes", "no"),
    "enabled": ("1", "yes", "on", "2", "y"),
}
MOE = ["model.shape=tiny-moe"]
MOE_BAD = {
    "num_experts": ("0", "-1", "1.5", "true", ".inf", HUGE, "x"),
    "num_experts_per_tok": ("0", "-1", "1.5", "true", ".inf", HUGE, "x"),
    "moe_intermediate_size": ("0", "-1", "1.5", "true", ".inf", HUGE, "x"),
    "norm_topk_prob": ("1", "yes", "x"),
    "router_aux_loss_coef": ("-1", ".nan", ".inf", "true", "x"),
}
TINY_MODEL = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 2048,
}
TINY_MOE_MODEL = {
    **TINY_MODEL,
    "model_type": "qwen3_moe",
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
}


def model_dir(config: dict, weights: bool = True) -> dict:
    """The files of a model.path directory {T}/m: its config.json, the demo tokenizer, and (a stand-in for) weights."""
    return {"m/config.json": json.dumps(config), **TOKENIZER_FILES, **({"m/model.safetensors": "x"} if weights else {})}


def both(
    cid: str, overrides: list[str], names: str, files: Optional[dict] = None, nodes: int = 1, gpus: int = 1
) -> list[Case]:
    """The same trainer arguments refused by ``python -m train`` (one rank) and by ``hpc.submit --dry-run`` (nodes x
    gpus)."""
    files = files or {}
    return [
        Case(f"{cid}-train", "train", ["--config", TINY, *overrides, "log.dir={T}/run"], names, files=files),
        Case(
            f"{cid}-submit",
            SUBMIT,
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
            ],
            names,
            files=files,
        ),
    ]


def lora_cases() -> list[Case]:
    c: list[Case] = []
    for key, value in LORA_KEYS.items():  # a key without lora.enabled would train a full fine-tune
        c += both(f"lora-alone-{key}", [f"lora.{key}={value}"], f"lora.{key}")
        c.append(
            Case(
                f"lora-alone-file-{key}",
                "train",
                ["--config", "{T}/c.yaml"],
                f"lora.{key}",
                files={"c.yaml": cfg_yaml({f"lora.{key}": yaml.safe_load(value)})},
            )
        )
    for key, values in LORA_BAD.items():
        for i, value in enumerate(values):
            c += both(f"lora-{key}-{i}", [*LORA_ON, f"lora.{key}={value}"], f"lora.{key}")
    c += both("lora-merge-no-export", [*LORA_ON, "lora.merge=true"], "lora.merge")
    for target in ("gate_proj", "up_proj", "down_proj"):  # a mixture of experts has no dense MLP in its layers
        c += both(
            f"lora-moe-{target}",
            [*LORA_ON, *MOE, f"lora.target_modules=[q_proj,{target}]"],
            f"{target} is not a linear layer",
        )
    c += both("lora-moe-default-targets", [*LORA_ON, *MOE], "lora.target_modules: gate_proj")
    c += both(
        "lora-moe-path-dense-layers",
        [*LORA_ON, "model.shape=null", "model.path={T}/m", "lora.target_modules=[down_proj]"],
        "decoder layer 1",
        files=model_dir({**TINY_MOE_MODEL, "mlp_only_layers": [0]}),
    )
    qlora = [*LORA_ON, "lora.quantize_base=nf4"]
    for nodes, gpus in ((1, 2), (2, 1), (2, 2), (4, 2)):
        c.append(
            Case(
                f"lora-nf4-ranks-{nodes}x{gpus}",
                SUBMIT,
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
                    *qlora,
                    "global_batch=16",
                ],
                f"WORLD_SIZE={nodes * gpus}",
            )
        )
    c.append(
        Case(
            "lora-nf4-ranks-env",
            "train",
            ["--config", TINY, *qlora, "log.dir={T}/run"],
            "WORLD_SIZE=2",
            env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29971"},
        )
    )
    c += both(
        "lora-nf4-block",
        [*qlora, "model.dims.hidden_size=36", "model.dims.intermediate_size=100"],
        "not a multiple of 64",
    )
    c.append(
        Case(
            "lora-off-on-purpose",
            SUBMIT,
            ["--site", "local", "--nodes", "1", "--dry-run", "--", "--config", TINY, "lora.enabled=false", "lora.r=8"],
            expect="ok",
        )
    )
    return c


def moe_cases() -> list[Case]:
    c: list[Case] = []
    for key in (
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "norm_topk_prob",
        "router_aux_loss_coef",
    ):
        value = {"norm_topk_prob": "true", "router_aux_loss_coef": "0.01"}.get(key, "4")
        c += both(
            f"moe-dense-{key}", [f"model.dims.{key}={value}"], f"model.dims.{key}"
        )  # silently a dense model, or a MoE of defaults
    for key, values in MOE_BAD.items():
        for i, value in enumerate(values):
            c += both(f"moe-{key}-{i}", [*MOE, f"model.dims.{key}={value}"], key)
    for cid, dims in (
        ("9-of-8", ["model.dims.num_experts_per_tok=9"]),
        ("2-of-1", ["model.dims.num_experts=1"]),
        ("4-of-3", ["model.dims.num_experts=3", "model.dims.num_experts_per_tok=4"]),
    ):
        c += both(f"moe-top-k-{cid}", [*MOE, *dims], "num_experts_per_tok")
    for cid, ep, nodes, gpus, extra in (
        ("3-of-dp2", 3, 1, 2, []),
        ("16-of-8-experts", 16, 4, 2, ["global_batch=32"]),
        ("2-of-dp3", 2, 3, 1, ["global_batch=6"]),
        ("4-of-dp2", 4, 2, 1, []),
        ("8-on-2-ranks", 8, 1, 2, []),
    ):
        c.append(
            Case(
                f"moe-ep-{cid}",
                SUBMIT,
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
                    *MOE,
                    f"parallel.ep={ep}",
                    *extra,
                ],
                "parallel.ep",
            )
        )
    for cid, ep in (("0", "0"), ("neg", "-1"), ("frac", "1.5"), ("true", "true"), ("huge", HUGE)):
        c += both(f"moe-ep-value-{cid}", [*MOE, f"parallel.ep={ep}"], "parallel.ep")
    path = ["model.shape=null", "model.path={T}/m"]
    for cid, config, names in (
        ("top-k", {**TINY_MOE_MODEL, "num_experts_per_tok": 8}, "num_experts_per_tok=8"),
        ("experts-text", {**TINY_MOE_MODEL, "num_experts": "4"}, "num_experts"),
        ("dense-layers-text", {**TINY_MOE_MODEL, "mlp_only_layers": "0"}, "mlp_only_layers"),
        ("hidden-0", {**TINY_MOE_MODEL, "hidden_size": 0}, "hidden_size"),
        ("llama", {**TINY_MODEL, "model_type": "llama"}, "llama"),
        ("no-type", {k: v for k, v in TINY_MODEL.items() if k != "model_type"}, "allowed: qwen3, qwen3_moe"),
        ("no-weights", TINY_MOE_MODEL, "safetensors"),
    ):
        c += both(f"moe-path-{cid}", path, names, files=model_dir(config, weights=cid != "no-weights"))
    return c


def feature_key_cases() -> list[Case]:
    """Keys that do nothing in the combination given: refused in one line."""
    c: list[Case] = []
    for cid, overrides, names in (
        ("straggler-slow-s", ["straggler.test_slow_s=0.5"], "straggler.test_slow_s"),
        ("straggler-slow-rank", ["straggler.test_slow_rank=0"], "straggler.test_slow_rank"),
        ("straggler-stop-step", ["straggler.test_stop_step=3"], "straggler.test_stop_step"),
        ("mlflow-uri", ["log.mlflow_uri=file:/tmp/x"], "log.mlflow_uri"),
        ("wandb-project", ["log.wandb_project=p"], "log.wandb_project"),
        ("fp8-recipe", ["fp8.recipe=rowwise"], "fp8.recipe"),
        ("vocab-small", ["model.dims.vocab_size=1000"], "vocab_size=1000"),
    ):
        c += both(f"no-effect-{cid}", overrides, names)
    for cid, nodes, gpus, rank in (
        ("slow-2-of-2", 1, 2, "test_slow_rank=2"),
        ("stop-4-of-4", 2, 2, "test_stop_rank=4"),
        ("slow-1-of-1", 1, 1, "test_slow_rank=1"),
    ):
        extra = ["straggler.test_slow_s=0.1"] if "slow" in rank else []
        c.append(
            Case(
                f"straggler-rank-{cid}",
                SUBMIT,
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
                    f"straggler.{rank}",
                    *extra,
                ],
                f"straggler.{rank.split('=')[0]}",
            )
        )
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):  # int() would read 1_0 as 10 and " 2" as 2
        for cid, value in (
            ("underscore", "1_0"),
            ("space", " 2"),
            ("trailing", "2 "),
            ("plus", "+2"),
            ("unicode", UNICODE_DIGIT),
            ("hex", "0x2"),
            ("float", "2.0"),
        ):
            env = {
                "WORLD_SIZE": "4",
                "RANK": "0",
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "4",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29972",
                var: value,
            }
            c.append(Case(f"train-env-{var}-{cid}", "train", ["--config", TINY], var, env=env))
    return c


def health_cases() -> list[Case]:
    c: list[Case] = []
    for flag, whole_only, over in (
        ("--gpus", True, "2000"),
        ("--matmul-tflops", False, "1e7"),
        ("--copy-gbps", False, "1e7"),
        ("--min-fraction", False, "1.5"),
    ):
        values = {**(BAD_WHOLE if whole_only else BAD_NUMBERS), "over": over}
        if flag != "--gpus":  # --gpus 0: a CPU partition
            values["zero"] = "0"
        before = [] if flag == "--gpus" else ["--gpus", "8"]
        for vid, value in values.items():
            c.append(Case(f"health-{flag.strip('-')}-{vid}", "hpc.node.health", [*before, flag, value], flag))
    for cid, path, files in (
        ("empty", "", {}),
        ("space", "  ", {}),
        ("under-file", "{T}/afile/marks", {"afile": "x"}),
        ("nul", "m\0", {}),
    ):
        c.append(Case(f"health-mark-{cid}", "hpc.node.health", ["--gpus", "8", "--mark", path], "--mark", files=files))
    c += [
        Case("health-gpus-twice", "hpc.node.health", ["--gpus", "8", "--gpus", "4"], "--gpus"),
        Case("health-no-gpus", "hpc.node.health", [], "--gpus"),
        Case("health-unknown-flag", "hpc.node.health", ["--gpus", "8", "--fraction", "0.5"], "--fraction"),
        Case("health-no-recording", "hpc.node.health", ["--gpus", "8", "--nvidia-smi-q", "a.txt"], "--nvidia-smi-q"),
        Case("health-ok-cpu-partition", "hpc.node.health", ["--gpus", "0"], expect="ok"),  # nvidia-smi not asked
    ]
    return c


def lease_record(**changes) -> str:
    import socket
    import time

    record = {
        "run_id": "other",
        "job_id": None,
        "job_name": "mine",
        "host": socket.gethostname(),
        "pid": 2**22 + 12345,
        "started": time.time(),
    }
    return json.dumps({k: v for k, v in {**record, **changes}.items() if v is not DELETE})


LEASE_GARBAGE = {
    "not-json": "{holder",
    "empty": "",
    "array": "[1, 2]",
    "string": '"lease"',
    "number": "7",
    "null": "null",
    "no-run-id": lease_record(run_id=DELETE),
    "run-id-number": lease_record(run_id=3),
    "no-host": lease_record(host=DELETE),
    "pid-text": lease_record(pid="12"),
    "pid-zero": lease_record(pid=0),
    "pid-bool": lease_record(pid=True),
    "job-id-list": lease_record(job_id=[1]),
    "started-0": lease_record(started=0),
    "started-text": lease_record(started="yesterday"),
    "started-future": lease_record(started=4e9),
    "started-nan": lease_record().replace('"started": ', '"started": NaN, "x": '),
    "started-huge": lease_record(started=1e300),
    "deep": "[" * 100_000 + "]" * 100_000,
    "digits": '{"pid": ' + HUGE + "}",
    "binary": b"\xff\xfe\x00",
}


def lease_cases() -> list[Case]:
    """A checkpoint directory whose lease file is no lease (or a live run's): one line naming it, nothing written.
    The run's directories exist and belong to the job already, so that nothing else would be written either."""
    import os

    c: list[Case] = []
    cfg = cfg_yaml({"checkpoint.dir": "{T}/ckpt"})
    owned = {"run/.owner.json": json.dumps({"job_name": "mine"}), "ckpt/.owner.json": json.dumps({"job_name": "mine"})}
    env = {"HPC_JOB_NAME": "mine"}
    for cid, text in LEASE_GARBAGE.items():
        c.append(
            Case(
                f"lease-{cid}",
                "train",
                ["--config", "{T}/c.yaml"],
                "is not a lease",
                env=env,
                files={"c.yaml": cfg, **owned, "ckpt/.lease.json": text},
            )
        )
    c.append(
        Case(
            "lease-fifo",
            "train",
            ["--config", "{T}/c.yaml"],
            "a FIFO",
            env=env,
            files={"c.yaml": cfg, **owned, "ckpt/.lease.json": FIFO},
        )
    )
    c.append(
        Case(
            "lease-directory",
            "train",
            ["--config", "{T}/c.yaml"],
            "a directory",
            env=env,
            files={"c.yaml": cfg, **owned, "ckpt/.lease.json/x": ""},
        )
    )
    c.append(
        Case(
            "lease-huge",
            "train",
            ["--config", "{T}/c.yaml"],
            "bytes",
            env=env,
            files={"c.yaml": cfg, **owned, "ckpt/.lease.json": " " * (64 << 10) + "{}"},
        )
    )
    c.append(
        Case(
            "lease-live-holder",
            "train",
            ["--config", "{T}/c.yaml"],
            "is in use by a run 'mine'",
            env=env,
            files={"c.yaml": cfg, **owned, "ckpt/.lease.json": lease_record(pid=os.getpid())},
        )
    )
    c.append(
        Case(
            "lease-live-holder-new-log-dir",
            "train",
            ["--config", "{T}/c.yaml", "log.dir={T}/newrun"],
            "is in use",
            env=env,
            files={"c.yaml": cfg, **owned, "ckpt/.lease.json": lease_record(pid=os.getpid())},
        )
    )
    c.append(
        Case(
            "owner-checkpoint-before-log",
            "train",
            ["--config", "{T}/c.yaml", "log.dir={T}/newrun"],
            "checkpoint.dir",
            env=env,
            files={"c.yaml": cfg, "ckpt/.owner.json": json.dumps({"job_name": "other"})},
        )
    )
    c.append(
        Case(
            "owner-record-fifo",
            "train",
            ["--config", "{T}/c.yaml"],
            "log.dir",
            env=env,
            files={"c.yaml": cfg, "run/.owner.json": FIFO},
        )
    )
    return c


def integration_cases() -> list[Case]:
    """The arguments of hpc.integrations' calls, refused by the call (tests/integration_helpers.py runs it)."""
    c: list[Case] = []

    def add(cid, call, args, names, files=None):
        c.append(Case(f"integrations-{cid}", "integration_helpers", [call, json.dumps(args)], names, files=files or {}))

    for cid, directory, files in (
        ("empty", "", {}),
        ("space", " ", {}),
        ("nul", "a\0b", {}),
        ("file", "{T}/afile", {"afile": "x"}),
        ("under-file", "{T}/afile/ckpt", {"afile": "x"}),
        ("fifo", "{T}/p", {"p": FIFO}),
        ("number", 3, {}),
        ("none", None, {}),
        ("list", ["{T}/a"], {}),
    ):
        add(f"requeue-dir-{cid}", "requeue", {"directory": directory}, "directory", files)
    for cid, keep in (
        ("zero", 0),
        ("neg", -1),
        ("frac", 1.5),
        ("true", True),
        ("text", "2"),
        ("none", None),
        ("list", [2]),
    ):
        add(f"requeue-keep-{cid}", "requeue", {"directory": "{T}/ckpt", "keep_last": keep}, "keep_last")
    for call in ("requeue", "callback"):
        for cid, environ in (
            ("path-text", "{T}/ckpt"),
            ("path", {"path": "{T}/ckpt"}),
            ("list", ["A=1"]),
            ("none", None),
            ("number", 1),
        ):
            args = {"environ": environ, **({"directory": "{T}/ckpt"} if call == "requeue" else {})}
            add(f"{call}-environ-{cid}", call, args, "environ")
    for cid, directory, files in (
        ("empty", "", {}),
        ("space", "  ", {}),
        ("nul", "x\0", {}),
        ("file", "{T}/afile", {"afile": "x"}),
        ("fifo", "{T}/p", {"p": FIFO}),
        ("none", None, {}),
        ("number", 3, {}),
        (
            "mixed",
            "{T}/out",
            {
                "out/checkpoint-3/meta.json": json.dumps({"step": 3, "world_size": 1}),
                "out/step-00000004/meta.json": json.dumps({"step": 4, "world_size": 1}),
            },
        ),
    ):
        add(f"newest-{cid}", "newest", {"output_dir": directory}, "output_dir", files)
    add("batches-empty", "batches", {"loader": []}, "loader")
    add("batches-no-length", "batches", {"loader": {"generator": [1, 2]}}, "loader")
    return c


def jobs_more_cases() -> list[Case]:
    c: list[Case] = []
    for sub in ("status", "logs", "report", "cancel"):
        for cid, jid in (
            ("plus", "+12"),
            ("frac", "12.5"),
            ("hex", "0x10"),
            ("exp", "1e3"),
            ("trailing-space", "12 "),
            ("unicode-task", "12_" + UNICODE_DIGIT),
            ("task-trailing", "12_0_"),
            ("over-32-bits-task", "12_4294967296"),
        ):
            c.append(Case(f"jobs-{sub}-more-{cid}", "hpc.jobs", [sub, jid], "job"))
        c.append(Case(f"jobs-{sub}-two-ids", "hpc.jobs", [sub, "12", "13"], "13"))
    for cid, out, files in (
        ("dir", "{T}/r.png", {"r.png/x": ""}),
        ("fifo", "{T}/r.png", {"r.png": FIFO}),
        ("nul", "r\0.png", {}),
        ("space", " ", {}),
    ):
        c.append(Case(f"jobs-report-out-is-{cid}", "hpc.jobs", ["report", "12", "--out", out], "--out", files=files))
    for cid, out, files in (
        ("file", "{T}/afile", {"afile": "x"}),
        ("under-file", "{T}/afile/tb", {"afile": "x"}),
        ("space", " ", {}),
    ):
        c.append(
            Case(
                f"jobs-report-tensorboard-{cid}",
                "hpc.jobs",
                ["report", "12", "--tensorboard", out],
                "--tensorboard",
                files=files,
            )
        )
    c += [
        Case("jobs-list-extra", "hpc.jobs", ["list", "12"], "12"),
        Case("jobs-cancel-missing", "hpc.jobs", ["cancel"], "job"),
        Case("jobs-report-missing", "hpc.jobs", ["report"], "job"),
        Case("jobs-logs-missing", "hpc.jobs", ["logs"], "job"),
        Case("jobs-since-twice", "hpc.jobs", ["list", "--since", "a", "--since", "b"], "--since"),
    ]
    return c


def generate_more_cases() -> list[Case]:
    c: list[Case] = []
    full = {"m/config.json": json.dumps(TINY_MODEL), **TOKENIZER_FILES}
    adapter = {"a/adapter_config.json": json.dumps({"base_model_name_or_path": "{T}/m"}), **full}

    def add(cid, args, names, files=None):
        c.append(Case(f"generate-{cid}", "train.generate", args, names, files=files or {}))

    add("base-on-full-model", ["{T}/m", "--base", "{T}/m"], "--base", full)
    add("base-empty", ["{T}/a", "--base", ""], "--base", adapter)
    add("base-space", ["{T}/a", "--base", " "], "--base", adapter)
    add("base-twice", ["{T}/a", "--base", "{T}/m", "--base", "{T}/m"], "--base", adapter)
    add("dir-fifo", ["{T}/m"], "{T}/m", {"m": FIFO})
    add("dir-file", ["{T}/m"], "{T}/m", {"m": "x"})
    for cid, text in (
        ("fifo", FIFO),
        ("list", "[1]"),
        ("binary", b"\xff\xfe"),
        ("huge-number", '{"a": ' + HUGE + "}"),
        ("deep", "[" * 100_000 + "]" * 100_000),
    ):
        add(f"config-{cid}", ["{T}/m"], "config.json", {"m/config.json": text})
    add("config-dir", ["{T}/m"], "config.json", {"m/config.json/x": ""})
    for cid, text in (
        ("fifo", FIFO),
        ("not-json", "{x"),
        ("list", "[1]"),
        ("no-base", "{}"),
        ("base-not-dir", json.dumps({"base_model_name_or_path": "{T}/nosuch"})),
        ("base-number", json.dumps({"base_model_name_or_path": 7})),
    ):
        add(f"adapter-{cid}", ["{T}/a"], "{T}/a", {**full, "a/adapter_config.json": text})
    add("adapter-base-config-fifo", ["{T}/a", "--base", "{T}/b"], "{T}/b", {**adapter, "b/config.json": FIFO})
    return c


def sbatch_prefix_cases() -> list[Case]:
    """extra_sbatch keys as sbatch reads them: a unique prefix of a forbidden option is that option; a prefix of several
    options is refused, as sbatch refuses it."""
    c: list[Case] = []
    run = ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run", "--", "{T}/s.py"]
    for key, names in (
        ("part", "--partition"),
        ("parti", "--partition"),
        ("job", "--job-name"),
        ("job-n", "--job-name"),
        ("nodel", "--nodelist"),
        ("nodeli", "--nodelist"),
        ("exc", "ambiguous"),
        ("exclu", "ambiguous"),
        ("exclud", "--exclude"),
        ("acc", "ambiguous"),
        ("acco", "--account"),
        ("accoun", "--account"),
        ("qo", "--qos"),
        ("ti", "ambiguous"),
        ("tim", "ambiguous"),
        ("sig", "--signal"),
        ("requ", "--requeue"),
        ("reque", "--requeue"),
        ("requeu", "--requeue"),
        ("no-req", "--no-requeue"),
        ("chd", "--chdir"),
        ("op", "--open-mode"),
        ("open", "--open-mode"),
        ("out", "--output"),
        ("outp", "--output"),
        ("er", "--error"),
        ("arr", "--array"),
        ("dep", "--dependency"),
        ("gp", "ambiguous"),
        ("gpus-per-n", "--gpus-per-node"),
        ("ntasks-per-n", "--ntasks-per-node"),
        ("tasks", "--ntasks-per-node"),
        ("tasks-per-node", "--ntasks-per-node"),
        ("cpus-per-t", "--cpus-per-task"),
        ("wr", "--wrap"),
        ("mem-per-c", "--mem-per-cpu"),
        ("mem-per-g", "--mem-per-gpu"),
        ("mem-p", "ambiguous"),
        ("n", "ambiguous"),
        ("nod", "ambiguous"),
        ("clus", "ambiguous"),
    ):
        c.append(
            Case(
                f"site-sbatch-prefix-{key}",
                SUBMIT,
                run,
                names,
                files={"p.yaml": site_yaml(submission__extra_sbatch={key: "x"}), **SCRIPT},
            )
        )
    for key in (
        "constraint",
        "container-image",
        "reservation",
        "mail-type",
        "exclusive",
    ):  # whole and unique, a plugin's
        c.append(
            Case(
                f"site-sbatch-allowed-{key}",
                SUBMIT,
                run,
                files={"p.yaml": site_yaml(submission__extra_sbatch={key: "x"}), **SCRIPT},
                expect="ok",
            )
        )
    return c


def sbatch_option_cases() -> list[Case]:
    """extra_sbatch generated from hpc/sbatch_options.py's tables: every option hpc.submit renders or refuses, by its
    shortest prefix that every supported Slurm version reads as that option (and the whole name); flags given a value,
    value options given none; options sbatch refuses together; --export other than ALL."""
    from hpc.sbatch_options import EXCLUSIVE, FLAG, REFUSED, RENDERED, VALUE, VERSIONS, accepted_prefixes

    c: list[Case] = []
    run = ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run", "--", "{T}/s.py"]

    def add(cid, extra, names, expect="error"):
        files = {"p.yaml": site_yaml(submission__extra_sbatch=extra), **SCRIPT}
        c.append(Case(f"sbatch-{cid}", SUBMIT, run, names if expect == "error" else None, files, expect=expect))

    for option in sorted(set(RENDERED) | set(REFUSED)):
        common = set.intersection(*(set(accepted_prefixes(option, o)) for o in VERSIONS.values() if option in o))
        shortest = min(common, key=len)
        add(f"prefix-{option}", {shortest: "x"}, f"--{option}" if shortest != option else option)
    flags = sorted(
        {o for v in VERSIONS.values() for o, kind in v.items() if kind == FLAG} - set(RENDERED) - set(REFUSED)
    )
    for option in flags:
        add(f"flag-with-value-{option}", {option: "yes"}, option)
        add(f"flag-ok-{option}", {option: True}, None, expect="ok")
    values = sorted(
        o for o, kind in VERSIONS["22.05"].items() if kind == VALUE and o not in RENDERED and o not in REFUSED
    )
    for option in values[:20]:
        if option != "export":
            add(f"value-as-flag-{option}", {option: True}, option)
    for a, b in EXCLUSIVE:
        given = {k: True if VERSIONS["22.05"].get(k) != VALUE else "1" for k in (a, b)}
        add(f"together-{a}-{b}", given, "together")
    for cid, value in (
        ("none", "NONE"),
        ("names", "PATH,HOME"),
        ("nil", "NIL"),
        ("lower-all", "all"),
        ("space", " ALL"),
    ):
        add(f"export-{cid}", {"export": value}, "export")
    add("false", {"contiguous": False}, "contiguous")
    return c


FABRICS = {
    "efa": {"fabric": "efa", "nccl_net_plugin": "ofi"},
    "efa-old": {"fabric": "efa", "nccl_net_plugin": "ofi", "versions": {"aws_ofi_nccl": "1.6.0"}},
    "slingshot": {"fabric": "slingshot"},
    "slingshot-old": {"fabric": "slingshot", "versions": {"nccl": "2.26.6", "libfabric": "1.17"}},
    "infiniband": {"fabric": "infiniband", "ib_hca": ["mlx5_0"], "gdr_level": "PHB"},
    "roce": {"fabric": "roce", "roce_gid_index": 3},
    "ethernet": {"fabric": "ethernet"},
}


def env_place_cases() -> list[Case]:
    """One setting, one place: every variable a network key of each fabric sets or owns (hpc/network.py's table),
    given again in network.extra_env or environment.variables; hpc.submit's own variables in environment.variables;
    one variable in both extra_env and environment.variables."""
    from hpc.job_env import JOB_VARS
    from hpc.network import network_settings
    from hpc.site import Network

    c: list[Case] = []
    run = ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run", "--", "{T}/s.py"]

    def add(cid, changes, names):
        files = {"p.yaml": site_yaml(**changes), **SCRIPT}
        c.append(Case(f"place-{cid}", SUBMIT, run, names, files))

    for fabric, keys in FABRICS.items():
        net = {**BASE_SITE["network"], **keys}
        for where, variables in network_settings(Network.model_validate(net))[:-1]:
            for var in variables:
                add(f"{fabric}-extra-{var}", {"network": {**net, "extra_env": {var: "1"}}}, where)
                add(f"{fabric}-variables-{var}", {"network": net, "environment__variables": {var: "1"}}, where)
    for var in JOB_VARS:
        add(f"job-{var}", {"environment__variables": {var: "1"}}, "hpc.submit")
    add(
        "both-places",
        {"network__extra_env": {"NCCL_DEBUG": "INFO"}, "environment__variables": {"NCCL_DEBUG": "WARN"}},
        "network.extra_env",
    )
    return c


PROFILE_BOUNDS = {  # profile key: the first value past its bound (the matching flag's or Slurm's)
    "partitions.0.max_nodes": 100_001,
    "partitions.0.gpus_per_node": 1025,
    "partitions.0.cpus_per_node": 65535,
    "partitions.0.mem_per_node_gb": 2**31 + 1,
    "preemption.lead_s": 10**7 + 1,
    "preemption.max_requeues": 100_001,
    "preemption.max_excluded_nodes": 100_001,
    "preemption.exclude_stragglers_after": 100_001,
    "restart.spare_nodes": 100_001,
    "restart.max_restarts": 100_001,
    "restart.max_restarts_per_node": 100_001,
}
NODE_BINDS = {  # gpu_bind on a node of 4 GPUs: what is wrong with it
    "map-beyond": "map_gpu:0,1,2,4",
    "map-nine": "map_gpu:9,0,1,2",
    "map-star-beyond": "map_gpu:0*3,7",
    "map-twice": "map_gpu:0,0,1,2",
    "map-star-twice": "map_gpu:0*2,1,2",
    "map-last-twice": "map_gpu:3,2,1,3",
    "map-verbose-twice": "verbose,map_gpu:1,1,2,3",
    "mask-empty": "mask_gpu:0x0,0x1,0x2,0x4",
    "mask-empty-plain": "mask_gpu:0,1,2,4",
    "mask-beyond": "mask_gpu:0x10,0x1,0x2,0x4",
    "mask-overlap": "mask_gpu:0x3,0x1,0x4,0x8",
    "mask-star-overlap": "mask_gpu:0x1*2,0x2,0x4",
    "per-task-beyond": "per_task:5",
}
JOB_BINDS = {  # gpu_bind valid on the node of 4 GPUs, wrong for the job's GPUs or ranks: (bind, --gpus-per-node)
    "map-beyond-job": ("map_gpu:0,1,2,3", "2"),
    "map-short": ("map_gpu:0,1", "4"),
    "map-long": ("map_gpu:0,1,2", "2"),
    "map-one": ("map_gpu:0", "3"),
    "mask-beyond-job": ("mask_gpu:0x1,0x2,0x4,0x8", "3"),
    "mask-short": ("mask_gpu:0x1,0x2", "4"),
    "per-task-over": ("per_task:2", "4"),
    "per-task-three": ("per_task:3", "2"),
}


def partition_value_cases() -> list[Case]:
    """Values checked against the partition: GPU bind lists and masks against the node's GPUs (4 here) and the job's
    ranks per node; every count of the profile bounded as the flag or Slurm field it becomes."""
    c: list[Case] = []
    four = {"partitions__0__gpus_per_node": 4, "partitions__0__cpus_per_node": 4, "partitions__0__max_nodes": 4}

    def add(cid, changes, names, flags=()):
        run = ["--site", "{T}/p.yaml", "--nodes", "1", *flags, "--dry-run", "--", "{T}/s.py"]
        c.append(Case(f"partvalue-{cid}", SUBMIT, run, names, {"p.yaml": site_yaml(**changes), **SCRIPT}))

    for cid, bind in NODE_BINDS.items():
        add(f"node-{cid}", {**four, "partitions__0__gpu_bind": bind}, "gpu_bind")
    for cid, (bind, gpus) in JOB_BINDS.items():
        add(f"job-{cid}", {**four, "partitions__0__gpu_bind": bind}, "gpu_bind", ["--gpus-per-node", gpus])
    for key, value in PROFILE_BOUNDS.items():
        add(f"bound-{key}", {key.replace(".", "__"): value}, key)
    return c


RESTART_ENV = {
    "SLURM_JOB_ID": "12",
    "SLURM_JOB_NODELIST": "n[1-3]",
    "HPC_JOB_DIR": "{T}/jobs",
    "HPC_STOP_RECORD": "{T}/jobs/stop",
}
RESTART_ARGS = ["--nodes", "2", "--tasks-per-node", "2", "--ranks", "4", "--marks", "{T}/jobs/marks"]


def restart_start_cases() -> list[Case]:
    """hpc.node.restart checks what hpc.node.launch checks before it makes a directory or runs srun: the job id, the
    restart count, the ranks against nodes x tasks, the allocation's nodes, the marks' and job directory's types."""
    c: list[Case] = []
    jobs = {"jobs/.keep": ""}

    def add(cid, names, env=None, args=None, files=None):
        argv = (RESTART_ARGS if args is None else args) + ["--", "srun", "true"]
        c.append(
            Case(
                f"restartstart-{cid}",
                "hpc.node.restart",
                argv,
                names,
                files=jobs if files is None else files,
                env={**RESTART_ENV, **(env or {})},
            )
        )

    for cid, value in {
        "zero": "0",
        "abc": "abc",
        "array": "1_2",
        "eleven-digits": "99999999999",
        "past-32-bits": "4294967296",
        "neg": "-1",
        "space": " 12",
        "newline": "12\n",
        "unicode": UNICODE_DIGIT * 2,
    }.items():
        add(f"job-id-{cid}", "SLURM_JOB_ID", env={"SLURM_JOB_ID": value})
    for cid, value in {
        "abc": "x",
        "neg": "-1",
        "frac": "1.5",
        "underscore": "1_0",
        "huge": "9999999",
        "space": " 1",
    }.items():
        add(f"restart-count-{cid}", "SLURM_RESTART_COUNT", env={"SLURM_RESTART_COUNT": value})
    for ranks in ("1", "3", "5", "8"):
        add(f"ranks-{ranks}", "--ranks", args=[*RESTART_ARGS[:5], ranks, *RESTART_ARGS[6:]])
    add(
        "nodes-past-allocation",
        "--nodes",
        args=["--nodes", "4", "--tasks-per-node", "1", "--ranks", "4", *RESTART_ARGS[6:]],
    )
    for cid, value in {"open": "n[1-", "reversed": "n[3-1]", "comma": ","}.items():
        add(f"nodelist-{cid}", "SLURM_JOB_NODELIST", env={"SLURM_JOB_NODELIST": value})
    add("marks-file", "--marks", files={**jobs, "jobs/marks": "x"})
    add("marks-fifo", "--marks", files={**jobs, "jobs/marks": FIFO})
    add("marks-no-parent", "--marks", args=[*RESTART_ARGS[:7], "{T}/nowhere/marks"])
    add("job-dir-missing", "HPC_JOB_DIR", files={})
    add("job-dir-file", "HPC_JOB_DIR", files={"jobs": "x"})
    add("job-dir-fifo", "HPC_JOB_DIR", files={"jobs": FIFO})
    add("stop-record-no-dir", "HPC_STOP_RECORD", env={"HPC_STOP_RECORD": "{T}/nowhere/stop"})
    add("log-fifo", "restarts.jsonl", files={**jobs, "jobs/restarts.jsonl": FIFO})
    add("log-dir", "restarts.jsonl", files={**jobs, "jobs/restarts.jsonl/x": ""})
    return c


def array_bound_cases() -> list[Case]:
    """Sweeps bounded by the cluster's MaxArraySize (the profile's submission.max_array_size, else Slurm's default
    1001), counted before any task is made; the key itself bounded by Slurm's largest, 4,000,001."""
    c: list[Case] = []
    tiny = ["--", "--config", TINY]
    for cid, limit, axes in (
        ("default", None, ["seed=" + ",".join(map(str, range(1002)))]),
        ("product", None, ["seed=" + ",".join(map(str, range(100))), "steps=" + ",".join(map(str, range(1, 12)))]),
        ("huge-product", None, [f"k{i}.x=" + ",".join(map(str, range(100))) for i in range(8)]),
        ("profile", 10, ["seed=" + ",".join(map(str, range(11)))]),
        ("profile-one", 1, ["seed=1,2"]),
    ):
        changes = {} if limit is None else {"submission__max_array_size": limit}
        sweep = [a for axis in axes for a in ("--sweep", axis)]
        c.append(
            Case(
                f"arraybound-{cid}",
                SUBMIT,
                ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run", *sweep, *tiny],
                "MaxArraySize",
                files={"p.yaml": site_yaml(**changes)},
            )
        )
    for cid, value in (("zero", 0), ("past-slurm", 4_000_002), ("text", "1001")):
        c.append(
            Case(
                f"arraybound-key-{cid}",
                SUBMIT,
                ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run", *RANK],
                "max_array_size",
                files={"p.yaml": site_yaml(submission__max_array_size=value), **SCRIPT},
            )
        )
    return c


def profile_keys() -> list[str]:
    """Every key of a site profile (hpc/site.py's models), dotted; a list of sections by its first item (``.0``)."""
    from typing import get_args

    from pydantic import BaseModel

    from hpc.site import SiteProfile

    def models(annotation) -> list[type]:
        found = [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []
        return found + [m for a in get_args(annotation) for m in models(a)]

    def walk(model, prefix: str):
        for name, f in model.model_fields.items():
            inner = models(f.annotation)
            index = ".0" if "list" in str(f.annotation) and inner else ""
            if inner:
                for m in inner:
                    yield from walk(m, f"{prefix}{name}{index}.")
            else:
                yield f"{prefix}{name}"

    return sorted(set(walk(SiteProfile, "")))


CONTAINER = {"runtime": "apptainer", "image": "docker://nvcr.io/nvidia/pytorch:25.10-py3"}


def profile_key_cases() -> list[Case]:
    """Every profile key (generated from hpc/site.py's models, so a new key has its case) given a value of no
    type it takes, a mapping in a mapping: one line naming the key."""
    c: list[Case] = []
    run = ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run", *RANK]
    for key in profile_keys():
        leaf, bad = key.rsplit(".", 1)[-1], {"nested": {"x": 1}}
        changes = {key.replace(".", "__"): bad}
        for section in ("container", "partitions.0.container"):
            if key.startswith(section + "."):
                changes = {section.replace(".", "__"): {**CONTAINER, leaf: bad}}
        c.append(Case(f"profilekey-{key}", SUBMIT, run, leaf, {"p.yaml": site_yaml(**changes), **SCRIPT}))
    return c


def flag_gap_cases() -> list[Case]:
    """The flags no other table gives bad: hpc.submit's --test-only, --exclude, --preflight; hpc.jobs' --follow;
    hpc.plan's --lora-r, --quantize-base; hpc.preflight's --nodelist and --exclude."""
    plan = ["--site", "ib-h200", "--nodes", "1", "--model", "8B"]
    return [
        Case("flag-submit-test-only-dry-run", SUBMIT, [*SITE, *DRY, "--test-only", *RANK], "--test-only", SCRIPT),
        Case("flag-submit-exclude-open", SUBMIT, [*SITE, *DRY, "--exclude", "n[1-", *RANK], "--exclude", SCRIPT),
        Case(
            "flag-submit-preflight-exclude",
            SUBMIT,
            [*SITE, *DRY, "--preflight", "--exclude", "n[", *RANK],
            "--exclude",
            SCRIPT,
        ),
        Case("flag-jobs-follow-job-zero", "hpc.jobs", ["logs", "0", "--follow"], "job id"),
        Case("flag-plan-lora-r-zero", "hpc.plan", [*plan, "--lora-r", "0"], "--lora-r"),
        Case("flag-plan-lora-r-text", "hpc.plan", [*plan, "--lora-r", "r8"], "--lora-r"),
        Case("flag-plan-quantize-base", "hpc.plan", [*plan, "--lora-r", "8", "--quantize-base", "nf8"], "--quantize"),
        Case("flag-preflight-exclude", "hpc.preflight", [*SITE, "--nodes", "1", "--exclude", "n[1-"], "--exclude"),
        Case("flag-preflight-nodelist", "hpc.preflight", [*SITE, "--nodes", "1", "--nodelist", "n[1-"], "--nodelist"),
    ]


def all_cases() -> list[Case]:
    cases = (
        site_form_cases()
        + number_cases()
        + config_cases()
        + trainer_cases()
        + submit_cases()
        + site_cases()
        + plan_cases()
        + preflight_cases()
        + jobs_cases()
        + launch_cases()
        + generate_cases()
        + message_cases()
        + lora_cases()
        + moe_cases()
        + feature_key_cases()
        + health_cases()
        + lease_cases()
        + integration_cases()
        + jobs_more_cases()
        + generate_more_cases()
        + sbatch_prefix_cases()
        + sbatch_option_cases()
        + env_place_cases()
        + partition_value_cases()
        + restart_start_cases()
        + array_bound_cases()
        + profile_key_cases()
        + flag_gap_cases()
    )
    ids = [c.id for c in cases]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    assert not dup, f"duplicate case ids: {dup}"
    return cases
