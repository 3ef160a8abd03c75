"""Bad-input survey: run every command of the project with bad (and hostile-but-valid) input.

    PYTHONPATH=$PWD python scripts/bad_inputs.py [--out /tmp/bad_inputs.json] [--workers 2] [--only TEXT ...] [--list]

Each case is a command line with optional environment changes and files made in a
fresh temporary directory (its working directory; ``{T}`` in an argument or value is that
directory, ``{JOB}`` a finished job of this survey). Expected:

* ``error``: exit 2, exactly one line on stderr (not counting the library noise in ``NOISE``), no traceback, the line containing the
  case's substring when one is given, and nothing left where a path must stay absent;
* ``ok``: exit 0 and no traceback (hostile but valid input, e.g. a job name full of shell
  text that must be carried exactly).

Cases run in a small pool; the output is a Markdown table (id, command, exit code, first
line of stderr, verdict), the counts, and the same table as JSON (``--out``).
Real submissions (sbatch refusing a script, a duplicate live job name) use job names
starting with ``badsurvey-`` and are cancelled afterwards. Needs the local cluster's
client environment (``source /tmp/hpc-slurm/env.sh``).
"""
from __future__ import annotations

import argparse
import copy
import getpass
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import yaml

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TIMEOUT_S = 150
TRAIN_TIMEOUT_S = 240
PREFIX = "badsurvey-"
DROP_ENV = ("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "HPC_", "NCCL_", "GLOO_", "GROUP_RANK", "NODE_RANK")


@dataclass
class Case:
    id: str
    argv: list[str]                       # after the interpreter, e.g. ["-m", "hpc.plan", ...]
    expect: str = "error"                 # "error", "ok", or "exit3" (a rank's own exit code 3 passed on)
    contains: Optional[str] = None        # substring of the error line (case-insensitive)
    env: dict[str, Optional[str]] = field(default_factory=dict)  # None removes the variable
    files: dict[str, bytes | str] = field(default_factory=dict)  # relative to {T}
    absent: list[str] = field(default_factory=list)              # paths that must not exist afterwards
    check: Optional[Callable[[Path, str], Optional[str]]] = None  # ok cases: (tmp, stdout) -> problem or None
    timeout: int = TIMEOUT_S
    good: str = ""                        # what a good answer is, for the table


# ---------------------------------------------------------------- fixtures

TINY_CFG = {
    "model": {"shape": "tiny"}, "data": {"path": None, "tokenizer": None},
    "seq_len": 16, "micro_batch": 1, "global_batch": 2, "steps": 1,
    "log": {"dir": "{T}/run", "log_every": 1}, "checkpoint": {"interval": 0},
}

BASE_SITE = yaml.safe_load((ROOT / "hpc" / "site_configs" / "local.yaml").read_text())
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


def cfg_yaml(changes: dict) -> str:
    return yaml.safe_dump(merged(TINY_CFG, changes), sort_keys=False)


SCRIPT = {"s.py": "print('rank ran')\n"}
SUBMIT = ["-m", "hpc.submit"]
DRY = ["--nodes", "1", "--dry-run"]


def exported(var: str, want: str, script: str = "job.sbatch"):
    """Check that the emitted script exports ``var`` with exactly ``want`` (evaluated by bash)."""
    def check(tmp: Path, stdout: str) -> Optional[str]:
        path = tmp / script
        if not path.is_file():
            return f"{script} not written"
        text = path.read_text()
        start = text.find(f"\nexport {var}=")
        if start < 0:
            return f"no 'export {var}=' line"
        lex = shlex.shlex(text[start + len(f"\nexport {var}="):], posix=True)
        lex.whitespace_split, lex.whitespace, lex.commenters = True, " \t\n", ""
        word = lex.get_token() or ""  # the value as the shell reads it (a quoted word may span lines)
        got = subprocess.run(["bash", "-c", f'export {var}={shlex.quote(word)}\nprintf %s "${var}"'],
                             capture_output=True, text=True).stdout
        return None if got == want else f"{var} evaluates to {got!r}, not {want!r}"
    return check


# ---------------------------------------------------------------- cases: hpc.submit flags

def submit_cases() -> list[Case]:
    c: list[Case] = []
    site = ["--site", "local"]

    def add(cid, flags, contains=None, rank=("--", "-m", "hpc.node.smoke"), **kw):
        c.append(Case(f"submit-{cid}", SUBMIT + list(flags) + list(rank), contains=contains, **kw))

    g_nodes = "--nodes: whole number 1..max_nodes of the partition"
    for cid, n in (("nodes-0", "0"), ("nodes-5", "5")):
        add(cid, site + ["--nodes", n, "--dry-run"], "--nodes", good=g_nodes)
    for cid, g in (("gpus-0", "0"), ("gpus-3", "3")):
        add(cid, site + DRY + ["--gpus-per-node", g], "--gpus-per-node", good="--gpus-per-node 1..2 on local")
    for cid, t in (("time-0", "0"), ("time-abc", "abc"), ("time-3h", "3:00:00"), ("time-unlimited", "UNLIMITED")):
        add(cid, site + DRY + ["--time", t], "--time", good="--time in Slurm form, at most the partition's 02:00:00")
    add("partition-nosuch", site + DRY + ["--partition", "gpu"], "partition", good="--partition one of debug, low, high")
    add("launcher-mpirun", site + DRY + ["--launcher", "mpirun"], "--launcher", good="--launcher srun|torchrun|accelerate")
    add("signal-kill", site + DRY + ["--signal", "KILL"], "--signal", good="--signal one of the allowed stop signals")
    add("lead-over-time", site + DRY + ["--signal-lead", "7200"], "--signal-lead",
        good="--signal-lead >= 10 s and below the time limit")
    add("requeues-neg", site + DRY + ["--max-requeues", "-1"], "--max-requeues", good="--max-requeues >= 0")
    add("container-no-runtime", site + DRY + ["--container", "pt.sif"], "--container",
        good="--container only where the profile has a container section")
    add("dryrun-and-emit", site + DRY + ["--emit", "{T}/job.sbatch"], "--emit", absent=["job.sbatch"],
        good="--dry-run and --emit exclude each other")
    add("wait-dryrun", site + DRY + ["--wait"], "--wait", good="--wait does not go with --dry-run")
    add("emit-unwritable", site + ["--nodes", "1", "--emit", "/proc/nope/job.sbatch"], "--emit",
        good="--emit FILE: cannot write it")
    add("unknown-flag", site + DRY + ["--nodez", "2"], "--nodez", good="unknown flag named")
    add("site-empty", ["--site", ""] + DRY, "site", good="--site: empty name")
    add("site-nosuch", ["--site", "nosuch"] + DRY, "nosuch", good="site not found, known sites listed")
    add("site-path-missing", ["--site", "{T}/missing.yaml"] + DRY, "does not exist", good="profile file does not exist")
    add("m-without-module", site + DRY, "-m", rank=("--", "-m"), good="-- -m needs a module")
    add("m-nosuch-module", site + DRY, "no such module", rank=("--", "-m", "no_such_mod_xyz"), good="-m MODULE: no such module")
    add("script-missing", site + DRY, "does not exist", rank=("--", "{T}/nosuch.py"), good="script does not exist")
    add("rank-args-only-dash", site + DRY, None, rank=("--", "-x"), good="trainer argument -x is not key=value")
    # sweeps (array jobs) and chains: the trainer's tiny config, so every combination is checked for real
    tiny = ("--", "--config", str(ROOT / "train" / "configs" / "tiny.yaml"))
    for cid, flags, contains, good in (
        ("sweep-not-a-key", ["--sweep", "optim.lrr=1e-4,3e-4"], "--sweep optim.lrr: not a config key", "--sweep KEY must be a config key"),
        ("sweep-empty", ["--sweep", "optim.lr="], "an empty value", "--sweep: at least one value"),
        ("sweep-empty-item", ["--sweep", "optim.lr=1e-4,"], "an empty value", "--sweep: no empty value"),
        ("sweep-twice", ["--sweep", "optim.lr=1e-4", "--sweep", "optim.lr=3e-4"], "given twice", "--sweep KEY once"),
        ("sweep-bad-combo", ["--sweep", "micro_batch=2,3"], "--sweep task [1] micro_batch=3", "every combination validated"),
        ("sweep-own-dir", ["--sweep", "log.dir=a,b"], "log.dir", "each task has its own log.dir"),
        ("max-parallel-alone", ["--max-parallel", "2"], "--max-parallel", "--max-parallel only with --sweep"),
        ("max-parallel-0", ["--sweep", "seed=1,2", "--max-parallel", "0"], "--max-parallel", "--max-parallel >= 1"),
        ("after-malformed", ["--after", "12x"], "--after", "--after JOB[:ok|any|notok]"),
        ("after-kind", ["--after", "12:later"], "--after", "--after kind ok, any or notok"),
        ("after-no-job", ["--after", "987654321"], "no such job", "--after: a job Slurm knows"),
    ):
        add(cid, site + DRY + flags, contains, rank=tiny, good=good)
    add("sweep-not-trainer", site + DRY + ["--sweep", "seed=1,2"], "--sweep", good="--sweep only with the trainer")
    # job names
    g_name = "--job-name: one non-empty line, no backslash, at most 200 characters"
    for cid, n in (("name-empty", ""), ("name-newline", "a\nb"), ("name-backslash", "a\\b"),
                   ("name-esc", "a\x1b[31mred")):
        add(cid, site + DRY + ["--job-name", n], "--job-name", good=g_name)
    hostile = {
        "name-shell": "a$(touch {T}/pwned)`id`;rm -rf ~ &|<>",
        "name-quotes": "it's \"quoted\" 'twice'",
        "name-dollar": "$HOME ${PATH} $1 $$",
        "name-200": "y" * 200,
        "name-unicode": "训练-λ-🚀",
        "name-dash": "-leading-dash",
        "name-sbatch": "x\u2028#SBATCH --qos=high",
    }
    for cid, n in hostile.items():
        c.append(Case(f"submit-{cid}", SUBMIT + site + ["--nodes", "1", "--emit", "{T}/job.sbatch", f"--job-name={n}",
                                                          "--", "-m", "hpc.node.smoke"],
                      expect="ok", check=_name_check(n), absent=["pwned"],
                      good="accepted; HPC_JOB_NAME in the script is the exact name"))
    # trainer arguments after --, on every site
    train_bad = [
        ("train-flag", ["--lr", "1e-3"], "--lr"),
        ("train-unknown-key", ["optim.lrr=1e-3"], "optim.lrr"),
        ("train-neg-lr", ["optim.lr=-1"], "optim.lr"),
        ("train-tp3", ["parallel.tp=3"], "parallel.tp"),
        ("train-config-missing", ["--config", "{T}/nosuch.yaml"], "nosuch.yaml"),
        ("train-batch", ["global_batch=3", "micro_batch=2"], "global_batch"),
        ("train-shape", ["model.shape=70B"], "model.shape"),
        ("train-data-missing", ["data.path={T}/nosuch.jsonl"], "data.path"),
        ("train-data-suffix", ["data.path={T}/d.csv"], "data.path"),
        ("train-tokenizer-missing", ["data.tokenizer={T}/notok"], "tokenizer"),
        ("train-log-owned", ["log.dir={T}/owned"], "log.dir"),
    ]
    owned = {"owned/.owner.json": json.dumps({"job_name": "someone-else"}), "d.csv": "text\nhello\n"}
    sites = {"local": ["--site", "local", "--nodes", "2"], "ib-h200": ["--site", "ib-h200", "--nodes", "2"],
             "eth-a100": ["--site", "eth-a100", "--nodes", "1"], "roce-h100": ["--site", "roce-h100", "--nodes", "1"]}
    for sname, sflags in sites.items():
        for cid, targs, contains in train_bad:
            if sname != "local" and cid not in ("train-flag", "train-tp3", "train-data-missing", "train-log-owned"):
                continue
            fit = ["global_batch=32"] if sname == "ib-h200" else []  # the demo config's batch over 16 ranks
            c.append(Case(f"submit-{sname}-{cid}", SUBMIT + sflags + ["--dry-run", "--"] + targs + fit, contains=contains,
                          files=owned, good="trainer argument checked at submit time: one line naming it"))
    # valid trainer overrides must pass on every site
    for sname, sflags in sites.items():
        fit = ["global_batch=32"] if sname == "ib-h200" else []  # the demo config's batch over 16 ranks
        c.append(Case(f"submit-{sname}-train-ok", SUBMIT + sflags + ["--dry-run", "--", "optim.lr=1e-3", *fit], expect="ok",
                      good="accepted"))
    c.append(Case("submit-user-unset", SUBMIT + ["--site", "ib-h200", "--nodes", "1", "--dry-run", "--", "-m", "hpc.node.smoke"],
                  env={"USER": None}, expect="ok", good="$USER in a profile path is the user's name even where the environment lacks it"))
    return c


def _name_check(name: str):
    def check(tmp: Path, stdout: str) -> Optional[str]:
        want = name.replace("{T}", str(tmp))
        return exported("HPC_JOB_NAME", want)(tmp, stdout)
    return check


# ---------------------------------------------------------------- cases: site profiles by path

def site_cases() -> list[Case]:
    c: list[Case] = []
    run = SUBMIT + ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run", "--", "{T}/s.py"]

    def bad(cid, text, contains=None, good="one line naming the file and key"):
        c.append(Case(f"site-{cid}", run, contains=contains, files={"p.yaml": text, **SCRIPT}, good=good))

    def ok(cid, text, check=None):
        c.append(Case(f"site-{cid}", run, expect="ok", files={"p.yaml": text, **SCRIPT}, check=check, good="accepted"))

    ok("baseline", site_yaml())
    # the file itself
    bad("binary", b"\x00\x01\x02\xff\xfe" * 20, "p.yaml", "not a text file")
    bad("latin1", "name: caf\xe9\n".encode("latin-1"), "UTF-8", "not UTF-8 at byte N")
    bad("empty", "", "p.yaml", "empty profile: a mapping of keys expected")
    bad("list-top", "- a\n- b\n", "mapping", "top level must be a mapping")
    bad("bad-yaml", "name: [unclosed\n", "YAML", "not valid YAML, line N")
    bad("python-tag", "name: !!python/object/apply:os.system ['true']\n", "YAML", "not valid YAML (no python tags)")
    bad("unknown-top", site_yaml(nmae="x"), "nmae", "unknown key nmae")
    bad("missing-name", site_yaml(name=DELETE), "name", "name is required")
    bad("name-slash", site_yaml(name="a/b"), "name", "name: letters, digits . _ -")
    bad("partitions-empty", site_yaml(partitions=[]), "partitions", "at least one partition")
    # partitions
    P = "partitions.0."
    for cid, key, val, cont in (
            ("part-max-nodes-0", "max_nodes", 0, "max_nodes"), ("part-gpus-0", "gpus_per_node", 0, "gpus_per_node"),
            ("part-time-bad", "max_time", "two hours", "max_time"), ("part-time-int", "max_time", 120, "max_time"),
            ("part-unknown-key", "max_gpus", 3, "max_gpus")):
        bad(cid, site_yaml(**{P.replace(".", "__") + key: val}), cont, f"partitions.0.{key}: what is allowed")
    two = [dict(BASE_SITE["partitions"][0]), dict(BASE_SITE["partitions"][1])]
    bad("part-dup-names", site_yaml(partitions=[two[0], {**two[1], "name": "debug"}]), "repeat", "partition names repeat")
    bad("part-two-defaults", site_yaml(partitions=[two[0], {**two[1], "default": True}]), "default", "one default partition")
    # network
    N = "network__"
    for cid, key, val, cont in (
            ("net-fabric", "fabric", "myrinet", "fabric"), ("net-nccl-trailing-comma", "nccl_socket_ifname", "eth0,", "nccl_socket_ifname"),
            ("net-gloo-caret", "gloo_socket_ifname", "^lo", "gloo_socket_ifname"),
            ("net-gloo-newline", "gloo_socket_ifname", "eth0\nrm", "gloo_socket_ifname"),
            ("net-expected-neg", "expected", {"intra_node_gbps": -5}, "intra_node_gbps")):
        bad(cid, site_yaml(**{N + key: val}), cont, f"network.{key}: what is allowed")
    ib = {"network__fabric": "infiniband"}
    for cid, hcas, cont in (("ib-hca-caret", ["^mlx5_0"], "ib_hca"), ("ib-hca-eq-late", ["mlx5_0", "=mlx5_1"], "ib_hca"),
                            ("ib-hca-comma-item", ["mlx5_0,mlx5_1"], "ib_hca")):
        bad(cid, site_yaml(**ib, network__ib_hca=hcas), cont, "network.ib_hca: NCCL HCA names, optional :port")
    bad("ib-hca-and-exclude", site_yaml(**ib, network__ib_hca=["mlx5_0"], network__ib_hca_exclude=["mlx5_1"]), "ib_hca",
        "ib_hca or ib_hca_exclude, not both")
    bad("ethernet-with-hca", site_yaml(network__ib_hca=["mlx5_0"]), "ethernet", "fabric ethernet takes no ib_hca")
    bad("roce-no-gid", site_yaml(network__fabric="roce"), "roce_gid_index", "fabric roce needs roce_gid_index")
    ok("ib-hca-ports", site_yaml(**ib, network__ib_hca=["=mlx5_0:1", "mlx5_1:1"]))
    for cid, env, cont in (("extra-env-dash", {"NCCL-DEBUG": "INFO"}, "NCCL-DEBUG"), ("extra-env-shell", {"A;id": "x"}, "A;id")):
        bad(cid, site_yaml(network__extra_env=env), cont, "network.extra_env: shell variable names, string values")
    # environment
    for cid, key, val, cont in (("env-var-dash", "variables", {"MY-VAR": "1"}, "MY-VAR"),
                                ("env-container-moved", "container", {"image": "x.sqsh"}, "top-level container"),
                                ("env-unknown", "conda", "train", "conda")):
        bad(cid, site_yaml(**{"environment__" + key: val}), cont, f"environment.{key}: what is allowed")
    # container
    for cid, section, cont in (("container-runtime", {"runtime": "docker", "image": "x"}, "container.runtime"),
                               ("container-no-sif", {"runtime": "apptainer", "image": "/no/such.sif"}, "/no/such.sif does not exist"),
                               ("container-mount", {"runtime": "pyxis", "image": "x", "mounts": ["/a:/b:rw"]}, "container.mounts"),
                               ("container-noimage", {"runtime": "pyxis"}, "needs image"),
                               ("container-placeholder", {"runtime": "command", "command": ["x", "{imag}"]}, "{imag}")):
        bad(cid, site_yaml(container=section), cont, "container: what is allowed")
    emit_run = SUBMIT + ["--site", "{T}/p.yaml", "--nodes", "1", "--emit", "{T}/job.sbatch", "--", "{T}/s.py"]

    def ok_exact(cid, text, var, want):
        c.append(Case(f"site-{cid}", emit_run, expect="ok", files={"p.yaml": text, **SCRIPT}, absent=["pwned"],
                      check=lambda tmp, out: exported(var, want.replace("{T}", str(tmp)))(tmp, out),
                      good=f"accepted; {var} carried exactly"))

    ok_exact("env-var-newline-value", site_yaml(environment__variables={"MYA": "x\ny"}), "MYA", "x\ny")
    bad("env-module-newline", site_yaml(environment__modules=["cuda\nrm -rf /"]), "modules", "module names are one line")
    hv = "$(touch {T}/pwned) `id` 'q' \"d\" \\ $HOME"
    ok_exact("env-var-hostile-value", site_yaml(environment__variables={"MYV": hv}), "MYV", hv)
    ok_exact("extra-env-hostile-value", site_yaml(network__extra_env={"NCCL_X": hv}), "NCCL_X", hv)
    # submission
    for cid, opts, cont in (("sbatch-upper", {"Constraint": "a100"}, "Constraint"), ("sbatch-dashes", {"--constraint": "x"}, "--constraint"),
                            ("sbatch-newline", {"constraint": "a\n#SBATCH --qos=high"}, "constraint"),
                            ("sbatch-wrap", {"wrap": "id"}, "wrap"),
                            ("sbatch-mem-per-gpu", {"mem-per-gpu": "1G"}, "mem-per-gpu"),
                            ("sbatch-mem-per-cpu", {"mem-per-cpu": "1G"}, "mem-per-cpu")):
        bad(cid, site_yaml(submission__extra_sbatch=opts), cont, "submission.extra_sbatch: allowed keys/values")
    ok("sbatch-hostile-value", site_yaml(submission__extra_sbatch={"comment": "a b 'q' \"d\" $(id) ;"}))
    # preemption
    for cid, key, val, cont in (("pre-signal-kill", "signal", "KILL", "signal"), ("pre-lead-5", "lead_s", 5, "lead_s")):
        bad(cid, site_yaml(**{"preemption__" + key: val}), cont, f"preemption.{key}: what is allowed")
    bad("pre-lead-over-limit", site_yaml(preemption__lead_s=7200), "lead", "preemption.lead_s shorter than the time limit")
    # paths
    for cid, key, val, cont in (("path-unset-var", "job_dir", "$NO_SUCH_VAR_XYZ/jobs", "NO_SUCH_VAR_XYZ"),
                                ("path-newline", "job_dir", "{T}/a\nb", "job_dir")):
        c.append(Case(f"site-{cid}", run, contains=cont, files={"p.yaml": site_yaml(**{"paths__" + key: val}), "afile": "x", **SCRIPT},
                      good=f"paths.{key}: what is allowed"))
    ok("path-hostile", site_yaml(paths__job_dir="{T}/j o b s;$(id)"))
    c.append(Case("site-path-under-file", emit_run, files={"p.yaml": site_yaml(paths__job_dir="{T}/afile/jobs"), "afile": "x", **SCRIPT},
                  contains="job_dir", good="paths.job_dir: cannot create it (not a directory)"))
    return c


def site_trainer_cases() -> list[Case]:
    """Profile keys that only the trainer path reaches."""
    run = SUBMIT + ["--site", "{T}/p.yaml", "--nodes", "1", "--dry-run"]
    return [
        Case("site-training-config-missing", run, contains="training.config",
             files={"p.yaml": site_yaml(training__config="{T}/nosuch.yaml")}, good="training.config: file does not exist"),
        Case("site-training-config-name", run, contains="nosuchcfg",
             files={"p.yaml": site_yaml(training__config="nosuchcfg")}, good="training.config: no train/configs/nosuchcfg.yaml"),
        Case("site-training-config-bad", run, contains="steps",
             files={"p.yaml": site_yaml(training__config="{T}/c.yaml"), "c.yaml": cfg_yaml({"steps": 0})},
             good="the default config's bad key named"),
    ]


# ---------------------------------------------------------------- cases: hpc.plan

def plan_cases() -> list[Case]:
    c: list[Case] = []
    base = ["-m", "hpc.plan", "--site", "ib-h200"]

    def add(cid, args, contains=None, good="one line naming the flag", expect="error", **kw):
        c.append(Case(f"plan-{cid}", base + args if not args or args[0] != "-m" else args, contains=contains, good=good,
                      expect=expect, **kw))

    add("model-tiny", ["--nodes", "1", "--model", "tiny"], "--model", "--model: allowed 0.6B..32B")
    add("model-70B", ["--nodes", "1", "--model", "70B"], "--model", "--model: allowed 0.6B..32B")
    add("model-missing", ["--nodes", "1"], "--model", "--model is required")
    add("nodes-0", ["--nodes", "0", "--model", "8B"], "--nodes", "--nodes >= 1")
    add("nodes-over-max", ["--nodes", "65", "--model", "8B"], "--nodes", "--nodes: the partition has at most 64")
    add("gpus-16", ["--nodes", "1", "--model", "8B", "--gpus-per-node", "16"], "--gpus-per-node", "--gpus-per-node 1..8")
    add("seq-0", ["--nodes", "1", "--model", "8B", "--seq-len", "0"], "--seq-len", "--seq-len >= 1")
    add("dtype-fp16", ["--nodes", "1", "--model", "8B", "--master-dtype", "fp16"], "--master-dtype", "--master-dtype fp32|bf16")
    add("partition-nosuch", ["--nodes", "1", "--model", "8B", "--partition", "cpu"], "partition", "--partition: allowed gpu, gpu-debug")
    add("no-fit", ["--nodes", "1", "--model", "32B", "--seq-len", "131072", "--micro-batch", "8"], "does not fit",
        "does not fit: what to change")
    add("site-no-gpumem", ["-m", "hpc.plan", "--site", "local", "--nodes", "1", "--model", "8B"], "gpu_memory_gb",
        "partition has no gpu_memory_gb")
    add("site-nosuch", ["-m", "hpc.plan", "--site", "nosuch", "--nodes", "1", "--model", "8B"], "nosuch", "site not found")
    add("site-bad-key", ["-m", "hpc.plan", "--site", "{T}/p.yaml", "--nodes", "1", "--model", "8B"], "bogus",
        "unknown key bogus", files={"p.yaml": site_yaml(bogus=1)})
    add("ok-8B", ["--nodes", "2", "--model", "8B"], expect="ok", good="a plan")
    return c


# ---------------------------------------------------------------- cases: hpc.preflight (bad flags only)

def preflight_cases() -> list[Case]:
    c: list[Case] = []
    base = ["-m", "hpc.preflight", "--site", "local"]

    def add(cid, args, contains, good):
        c.append(Case(f"preflight-{cid}", base + args, contains=contains, good=good))

    add("minfrac-0", ["--nodes", "1", "--min-fraction", "0"], "--min-fraction", "--min-fraction in (0, 1]")
    add("minfrac-1.5", ["--nodes", "1", "--min-fraction", "1.5"], "--min-fraction", "--min-fraction in (0, 1]")
    add("minfrac-nan", ["--nodes", "1", "--min-fraction", "nan"], "--min-fraction", "--min-fraction in (0, 1]")
    add("bytes-order", ["--nodes", "1", "--min-bytes", "1000", "--max-bytes", "10"], "--min-bytes", "--min-bytes <= --max-bytes")
    add("nodes-0", ["--nodes", "0"], "--nodes", "--nodes >= 1")
    c.append(Case("preflight-out-unwritable", base + ["--nodes", "1", "--out", "/proc/nope", "--time", "3"], contains="--out",
                  good="--out /proc/nope: cannot write there (checked before submitting)", timeout=300))
    return c


# ---------------------------------------------------------------- cases: hpc.jobs

def jobs_cases() -> list[Case]:
    c: list[Case] = []
    J = ["-m", "hpc.jobs"]
    for sub in ("status", "logs", "report", "cancel"):
        for cid, jid in (("abc", "abc"), ("array", "12_3"), ("neg", "-5"), ("empty", ""), ("huge", "99999999999999999999"),
                         ("shell", "1;id"), ("step", "99999999.batch"), ("nosuch", "99999999")):
            if sub == "cancel" and jid in ("12_3",):
                continue
            c.append(Case(f"jobs-{sub}-{cid}", J + [sub, jid], contains=None, good="unknown job / not a job id: one line"))
    c.append(Case("jobs-no-sub", J, contains=None, good="a subcommand is required"))
    c.append(Case("jobs-bad-sub", J + ["kill", "1"], contains="kill", good="unknown subcommand"))
    c.append(Case("jobs-status-missing", J + ["status"], contains="job", good="JOB is required"))
    c.append(Case("jobs-list-since-bad", J + ["list", "--since", "yesterday-ish"], contains="--since",
                  good="--since: not a Slurm time"))
    c.append(Case("jobs-logs-rank-abc", J + ["logs", "{JOB}", "--rank", "x"], contains="--rank", good="--rank: a whole number"))
    c.append(Case("jobs-logs-rank-neg", J + ["logs", "{JOB}", "--rank", "-1"], contains="rank", good="--rank >= 0"))
    c.append(Case("jobs-logs-rank-9", J + ["logs", "{JOB}", "--rank", "9"], contains="9", good="no log for task 9"))
    c.append(Case("jobs-report-nometrics", J + ["report", "{JOB}"], contains="metrics", good="no metrics yet"))
    c.append(Case("jobs-status-ok", J + ["status", "{JOB}"], expect="ok", good="state shown"))
    c.append(Case("jobs-logs-ok", J + ["logs", "{JOB}"], expect="ok", good="log shown"))
    c.append(Case("jobs-cancel-finished", J + ["cancel", "{JOB}"], expect="ok", good="already ended, exit 0"))
    c.append(Case("jobs-list-ok", J + ["list"], expect="ok", good="a table"))
    return c


# ---------------------------------------------------------------- cases: hpc.node.launch with hand-made SLURM_* environments

SRUN_ENV = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
            "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)",
            "SLURM_GPUS_ON_NODE": "2"}


def launch_cases() -> list[Case]:
    c: list[Case] = []
    L = ["-m", "hpc.node.launch"]
    true_cmd = ["--", "true"]

    def add(cid, env, contains=None, args=None, expect="error", good="hpc.node.launch: error: NODE: the variable and what is allowed", **kw):
        c.append(Case(f"launch-{cid}", L + (args if args is not None else true_cmd), contains=contains,
                      env={**SRUN_ENV, **env}, expect=expect, good=good, **kw))

    add("ok", {}, expect="ok", good="runs the command")
    for var in SRUN_ENV:
        if var == "SLURM_GPUS_ON_NODE":
            continue
        add(f"missing-{var}", {var: None}, var.replace("SLURM_NTASKS", "NUM_TASKS").replace("SLURM_JOB_NUM_NODES", "NUM_NODES")
            .replace("SLURM_JOB_NODELIST", "NODELIST").replace("SLURM_TASKS_PER_NODE", "TASKS_PER_NODE"))
    for var in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_NUM_NODES"):
        for cid, val in (("abc", "abc"), ("neg", "-1"), ("float", "1.0"), ("underscore", "1_0"), ("space", " 1"),
                         ("unicode-digit", "\u0661")):
            add(f"{var}-{cid}", {var: val}, var)
    add("jobid-12_3", {"SLURM_JOB_ID": "12_3"}, "SLURM_JOB_ID", good="SLURM_JOB_ID='12_3' is not a whole number")
    add("jobid-empty", {"SLURM_JOB_ID": ""}, "SLURM_JOB_ID", good="missing SLURM_JOB_ID")
    add("procid-ge-ntasks", {"SLURM_PROCID": "4"}, "SLURM_PROCID")
    add("localid-ge-local", {"SLURM_LOCALID": "2"}, "SLURM_LOCALID")
    add("nodeid-ge-nnodes", {"SLURM_NODEID": "2"}, "SLURM_NODEID")
    add("ntasks-0", {"SLURM_NTASKS": "0"}, "tasks")
    add("nnodes-0", {"SLURM_JOB_NUM_NODES": "0"}, "nodes")
    add("ntasks-not-fill", {"SLURM_NTASKS": "3"}, "tasks")
    add("tpn-uneven", {"SLURM_TASKS_PER_NODE": "2,1", "SLURM_NTASKS": "3"}, "tasks per node")
    add("tpn-garbage", {"SLURM_TASKS_PER_NODE": "2(x2"}, "SLURM_TASKS_PER_NODE")
    add("tpn-letters", {"SLURM_TASKS_PER_NODE": "two"}, "SLURM_TASKS_PER_NODE")
    add("tpn-zero-repeat", {"SLURM_TASKS_PER_NODE": "2(x0)"}, "SLURM_TASKS_PER_NODE")
    add("tpn-node-count-mismatch", {"SLURM_TASKS_PER_NODE": "2(x3)"}, "SLURM_TASKS_PER_NODE",
        good="SLURM_TASKS_PER_NODE lists 3 nodes but the step has 2")
    add("gpus-mismatch", {"SLURM_GPUS_ON_NODE": "4"}, "GPUs")
    add("gpus-abc", {"SLURM_GPUS_ON_NODE": "all"}, "SLURM_GPUS_ON_NODE")
    add("gpus-flag-0", {}, "--gpus-per-node", args=["--gpus-per-node", "0"] + true_cmd, good="--gpus-per-node >= 1")
    add("gpus-flag-neg", {}, "--gpus-per-node", args=["--gpus-per-node", "-2"] + true_cmd, good="--gpus-per-node >= 1")
    add("gpus-flag-abc", {}, "--gpus-per-node", args=["--gpus-per-node", "x"] + true_cmd, good="--gpus-per-node: a whole number")
    add("restart-abc", {"SLURM_RESTART_COUNT": "x"}, "SLURM_RESTART_COUNT")
    add("restart-neg", {"SLURM_RESTART_COUNT": "-1"}, "SLURM_RESTART_COUNT")
    add("nodelist-bad", {"SLURM_JOB_NODELIST": "n[1-"}, "SLURM_JOB_NODELIST")
    add("nodelist-reversed", {"SLURM_JOB_NODELIST": "n[3-1]"}, "SLURM_JOB_NODELIST")
    add("nodelist-comma-only", {"SLURM_JOB_NODELIST": ","}, "SLURM_JOB_NODELIST")
    add("nodelist-too-few", {"SLURM_JOB_NODELIST": "n1"}, "SLURM_JOB_NODELIST",
        good="SLURM_JOB_NODELIST has 1 host but the step has 2 nodes")
    add("step-over-job", {"SLURM_STEP_NUM_TASKS": "x"}, "SLURM_STEP_NUM_TASKS")
    add("no-command", {}, "command", args=["--"], good="no command given after --")
    add("missing-exe", {}, "nosuch_exe_xyz", args=["--", "nosuch_exe_xyz"], good="cannot run 'nosuch_exe_xyz'")
    add("exe-not-executable", {}, "plain.txt", args=["--", "{T}/plain.txt"], files={"plain.txt": "x"},
        good="cannot run it: permission denied")
    add("exe-dir", {}, "adir", args=["--", "{T}/adir"], files={"adir/x": ""}, good="cannot run it: is a directory")
    add("launcher-bad", {}, "--launcher", args=["--launcher", "mpirun"] + true_cmd, good="--launcher srun|torchrun|accelerate")
    add("unknown-flag", {}, "--nodes", args=["--nodes", "2"] + true_cmd, good="unknown flag")
    add("torchrun-tasks", {}, "one task per node", args=["--launcher", "torchrun"] + true_cmd)
    add("accelerate-tasks", {}, "one task per node", args=["--launcher", "accelerate"] + true_cmd)
    add("torchrun-no-gpus", {"SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_GPUS_ON_NODE": None},
        "--gpus-per-node", args=["--launcher", "torchrun"] + true_cmd)
    # network variables
    for cid, env, cont in (
            ("gloo-nosuch", {"GLOO_SOCKET_IFNAME": "nosuch0"}, "GLOO_SOCKET_IFNAME"),
            ("gloo-down", {"GLOO_SOCKET_IFNAME": "ifb0"}, "GLOO_SOCKET_IFNAME"),
            ("gloo-list-one-bad", {"GLOO_SOCKET_IFNAME": "lo,nosuch0"}, "nosuch0"),
            ("gloo-caret", {"GLOO_SOCKET_IFNAME": "^lo"}, "GLOO_SOCKET_IFNAME"),
            ("nccl-nosuch", {"NCCL_SOCKET_IFNAME": "nosuch"}, "NCCL_SOCKET_IFNAME"),
            ("nccl-exact-nosuch", {"NCCL_SOCKET_IFNAME": "=eth"}, "NCCL_SOCKET_IFNAME"),
            ("nccl-exclude-all", {"NCCL_SOCKET_IFNAME": "^e,l,i,s"}, "NCCL_SOCKET_IFNAME"),
            ("nccl-garbage", {"NCCL_SOCKET_IFNAME": "^^"}, "NCCL_SOCKET_IFNAME"),
            ("ib-hca-nosuch", {"NCCL_IB_HCA": "mlx5_0"}, "NCCL_IB_HCA"),
            ("ib-hca-port-bad", {"NCCL_IB_HCA": "mlx5_0:x"}, "NCCL_IB_HCA"),
            ("timeout-abc", {"HPC_DIST_TIMEOUT_S": "abc"}, "HPC_DIST_TIMEOUT_S"),
            ("timeout-0", {"HPC_DIST_TIMEOUT_S": "0"}, "HPC_DIST_TIMEOUT_S"),
            ("timeout-neg", {"HPC_DIST_TIMEOUT_S": "-5"}, "HPC_DIST_TIMEOUT_S"),
            ("timeout-nan", {"HPC_DIST_TIMEOUT_S": "nan"}, "HPC_DIST_TIMEOUT_S"),
            ("timeout-inf", {"HPC_DIST_TIMEOUT_S": "inf"}, "HPC_DIST_TIMEOUT_S")):
        add(cid, env, cont, good=f"{cont}: what the node has / what is allowed")
    add("ib-disabled-ok", {"NCCL_IB_HCA": "mlx5_0", "NCCL_IB_DISABLE": "1"}, expect="ok", good="IB disabled: HCA not checked")
    add("nccl-exclude-ok", {"NCCL_SOCKET_IFNAME": "^lo,docker"}, expect="ok", good="eth0 remains")
    add("gloo-lo-ok", {"GLOO_SOCKET_IFNAME": "lo"}, expect="ok", good="lo is up")
    add("rank-exit-3", {}, args=["--", "sh", "-c", "exit 3"], expect="error",
        good="the rank's own exit code passed on (3), not turned into 2")
    c[-1].expect = "exit3"
    return c


# ---------------------------------------------------------------- cases: python -m train (slow: imports torch)

def train_cases() -> list[Case]:
    c: list[Case] = []
    T = ["-m", "train", "--config", "{T}/c.yaml"]

    def add(cid, files=None, args=(), env=None, contains=None, good="error: one line naming the key", cfg=None, **kw):
        f = {"c.yaml": cfg_yaml(cfg or {})}
        f.update(files or {})
        c.append(Case(f"train-{cid}", T + list(args), contains=contains, env=env or {}, files=f, good=good,
                      timeout=TRAIN_TIMEOUT_S, **kw))

    def raw(cid, text, contains, good):
        c.append(Case(f"train-{cid}", T, contains=contains, files={"c.yaml": text}, good=good, timeout=TRAIN_TIMEOUT_S))

    raw("config-binary", b"\x00\xff\x10\x80" * 50, "c.yaml", "--config: not a text file")
    raw("config-empty", "", "model", "model is required")
    c.append(Case("train-config-dir", ["-m", "train", "--config", "{T}/adir"], contains="adir", files={"adir/x": ""},
                  good="--config: is a directory", timeout=TRAIN_TIMEOUT_S))
    c.append(Case("train-config-missing", ["-m", "train", "--config", "{T}/nosuch.yaml"], contains="nosuch.yaml",
                  good="--config: cannot read", timeout=TRAIN_TIMEOUT_S))
    add("unknown-key", cfg={"optimizer": {"lr": 1}}, contains="optimizer")
    add("override-unknown", args=["optim.lrr=1"], contains="optim.lrr")
    add("lr-neg", cfg={"optim.lr": -1}, contains="optim.lr")
    add("betas-over-1", cfg={"optim.betas": [1.5, 0.95]}, contains="optim.betas", good="optim.betas in [0, 1)")
    add("steps-0", cfg={"steps": 0}, contains="steps")
    add("tp-3", args=["parallel.tp=3"], contains="parallel.tp")
    # layouts from the environment
    add("env-rank-ge-world", env={"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}, contains="RANK")
    add("env-no-master", env={"WORLD_SIZE": "2", "RANK": "0"}, contains="MASTER_ADDR")
    add("env-tp-across-nodes", args=["parallel.tp=2"], env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_WORLD_SIZE": "1",
                                                             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29998"},
        contains="parallel.tp")
    add("env-batch-dp", args=["global_batch=3", "micro_batch=1"], env={"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1",
                                                                       "MASTER_PORT": "29997"},
        contains="global_batch")
    # data
    add("data-missing", cfg={"data.path": "{T}/nosuch.jsonl"}, contains="data.path")
    add("data-suffix", cfg={"data.path": "{T}/d.csv"}, files={"d.csv": "a,b\n"}, contains="data.path")
    add("data-bad-json", cfg={"data.path": "{T}/d.jsonl"}, files={"d.jsonl": '{"text": "a"}\nnot json\n'}, contains="data.path")
    add("data-no-field", cfg={"data.path": "{T}/d.jsonl"}, files={"d.jsonl": '{"body": "hello world"}\n'}, contains="text_field")
    add("data-binary-txt", cfg={"data.path": "{T}/d.txt"}, files={"d.txt": b"\xff\xfe\x00\x81" * 100}, contains="data.path")
    add("data-too-small", cfg={"data.path": "{T}/d.txt"}, files={"d.txt": "hi"}, contains="data",
        good="data: fewer tokens than one global batch")
    add("tokenizer-missing", cfg={"data.tokenizer": "{T}/notok"}, contains="tokenizer")
    add("vocab-too-small", cfg={"model.dims": {"vocab_size": 10}}, contains="vocab_size")
    # ownership
    owner = {"owned/.owner.json": json.dumps({"job_name": "other-job"})}
    add("owner-log", files=owner, cfg={"log.dir": "{T}/owned"}, env={"HPC_JOB_NAME": "mine"}, contains="log.dir")
    add("export-under-file", files={"afile": "x"}, cfg={"export": "{T}/afile/hf"}, contains="export",
        good="export: cannot create it (checked before training)")
    return c


# ---------------------------------------------------------------- cases that submit for real

def real_cases() -> list[Case]:
    run = SUBMIT + ["--site", "{T}/p.yaml", "--nodes", "1", "--gpus-per-node", "1", "--time", "5"]
    script = ["--", "{T}/s.py"]
    c = []
    for cid, opts, cont in (("sbatch-constraint", {"constraint": "nosuchfeature"}, "constraint"),
                            ("sbatch-unknown-option", {"no-such-option": "1"}, "no-such-option"),
                            ("sbatch-mail-type", {"mail-type": "SOMETIMES"}, "mail-type"),
                            ("sbatch-exclusive-bad", {"exclusive": "bogus"}, "exclusive")):
        c.append(Case(f"real-{cid}", run + ["--job-name", PREFIX + cid] + script, contains=cont,
                      files={"p.yaml": site_yaml(submission__extra_sbatch=opts), **SCRIPT},
                      good="sbatch's refusal in one line naming the option"))
    c.append(Case("real-account", run + ["--job-name", PREFIX + "account"] + script, expect="ok",
                  files={"p.yaml": site_yaml(submission__account="nosuchaccount"), **SCRIPT},
                  good="accepted: the local cluster does not enforce accounts (a cluster that does refuses it in sbatch's one line)"))
    c.append(Case("real-slurm-conf-missing", run + ["--job-name", PREFIX + "conf"] + script, contains="slurm",
                  files={"p.yaml": site_yaml(submission__slurm_conf="/no/such/slurm.conf"), **SCRIPT},
                  env={"SLURM_CONF": None}, good="slurm_conf does not exist, one line"))
    c.append(Case("real-duplicate-name", run + ["--job-name", PREFIX + "dup"] + script, contains="--job-name",
                  files={"p.yaml": site_yaml(), **SCRIPT}, good="a job of that name is running"))
    c.append(Case("real-hostile-name-ok", run + ["--job-name", PREFIX + "it's $(id) `x` \"q\""] + script, expect="ok",
                  files={"p.yaml": site_yaml(), **SCRIPT}, good="submitted; Slurm's job name is the exact name",
                  check=_slurm_name_check(PREFIX + "it's $(id) `x` \"q\"")))
    return c


def _slurm_name_check(name: str):
    def check(tmp: Path, stdout: str) -> Optional[str]:
        line = next((l for l in stdout.splitlines() if l.startswith("submitted job ")), None)
        if not line:
            return "no 'submitted job' line"
        job_id = line.split()[2]
        from hpc.slurm_query import scontrol_fields

        for _ in range(20):
            got = scontrol_fields(job_id).get("JobName", "")  # slurmctld's record of the exact name
            if got:
                return None if got == name else f"Slurm's job name is {got!r}, not {name!r}"
            time.sleep(1)
        return f"job {job_id} not found in squeue/sacct"
    return check


# ---------------------------------------------------------------- running

def all_cases() -> list[Case]:
    cases = (submit_cases() + site_cases() + site_trainer_cases() + plan_cases() + preflight_cases() + jobs_cases()
             + launch_cases() + train_cases() + real_cases())
    ids = [c.id for c in cases]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise SystemExit(f"duplicate case ids: {sorted(dup)}")
    return cases


def fill(text: str, tmp: Path, job: str) -> str:
    return text.replace("{T}", str(tmp)).replace("{JOB}", job)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROP_ENV)}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               USER=env.get("USER") or getpass.getuser(), PYTHONDONTWRITEBYTECODE="1")
    conf = os.environ.get("SLURM_CONF")
    if conf:
        env["SLURM_CONF"] = conf
    return env


# Library noise that is not the project's message: torchao's one-line notice that its compiled extension
# was built for another Python (printed when the trainer's imports load torchao).
NOISE = re.compile(r"^Failed to load .*/torchao/")


def stderr_lines(text: str) -> list[str]:
    """The non-empty stderr lines, without the library noise above."""
    return [l for l in text.splitlines() if l.strip() and not NOISE.search(l)]


def stderr_lines_all(text: str) -> list[str]:
    return [l for l in text.splitlines() if l.strip()]


def judge(case: Case, rc: Optional[int], out: str, err: str, tmp: Path) -> str:
    """'good' or what is wrong."""
    if rc is None:
        return f"hung (killed after {case.timeout} s)"
    lines = stderr_lines(err)
    problems = []
    if "Traceback" in err:
        problems.append("traceback")
    if case.expect == "ok":
        if rc != 0:
            problems.append(f"exit {rc}, expected 0")
        elif case.check:
            p = case.check(tmp, out)
            if p:
                problems.append(p)
    elif case.expect == "exit3":
        if rc != 3:
            problems.append(f"exit {rc}, expected the rank's 3")
    else:
        if rc != 2:
            problems.append(f"exit {rc}, expected 2")
        if len(lines) != 1:
            problems.append(f"{len(lines)} stderr lines, expected 1")
        if case.contains and not any(case.contains.lower() in l.lower() for l in lines[:2]):
            problems.append(f"message does not name {case.contains!r}")
    for rel in case.absent:
        if (tmp / rel).exists():
            problems.append(f"{rel} exists afterwards")
    return "good" if not problems else "; ".join(problems)


def run_case(case: Case, job: str, env0: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bad-inputs-") as d:
        tmp = Path(d)
        for rel, content in case.files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(fill(content, tmp, job))
        env = dict(env0)
        for k, v in case.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = fill(v, tmp, job)
        argv = [PY] + [fill(a, tmp, job) for a in case.argv]
        t0 = time.time()
        try:
            p = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, errors="replace", timeout=case.timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = None, _text(e.stdout), _text(e.stderr)
        verdict = judge(case, rc, out, err, tmp)
        shown = " ".join(shlex.quote(a) for a in case.argv).replace(str(tmp), "{T}")
        envs = " ".join(f"{k}={'<unset>' if v is None else shlex.quote(v)}" for k, v in case.env.items()
                        if k not in SRUN_ENV or SRUN_ENV.get(k) != v)
        lines = stderr_lines(err)
        return {"id": case.id, "command": (envs + " " if envs else "") + "python " + shown, "expect": case.expect,
                "exit": rc, "first_line": (lines[0] if lines else "").replace(str(tmp), "{T}"),
                "stderr_head": [l.replace(str(tmp), "{T}") for l in (lines if len(lines) <= 8 else lines[:4] + ["..."] + lines[-3:])],
                "stderr_lines": len(lines), "noise_lines": len(stderr_lines_all(err)) - len(lines),
                "verdict": verdict, "good_answer": case.good, "seconds": round(time.time() - t0, 1)}


def _text(b) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def finished_job(env: dict[str, str], workdir: Path) -> str:
    """A small finished job whose directory is under ``workdir`` (for the hpc.jobs cases)."""
    out = workdir / "jobs" / "fixture"
    out.mkdir(parents=True)
    r = subprocess.run(["sbatch", "--parsable", "-J", PREFIX + "fixture", "-N", "1", "-n", "1", "-t", "2",
                        "-o", str(out / "%j_0_log.out"), "--wrap", "echo fixture done"],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"sbatch of the fixture job failed: {r.stderr.strip()}")
    job = r.stdout.strip().split(";")[0]
    for _ in range(120):
        s = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, env=env).stdout.strip()
        if not s:
            return job
        time.sleep(1)
    raise SystemExit(f"fixture job {job} did not finish within 120 s")


def hold_duplicate(env: dict[str, str], workdir: Path) -> None:
    """A held job named like the duplicate-name case's, so that submission must refuse the name."""
    r = subprocess.run(["sbatch", "--parsable", "-J", PREFIX + "dup", "-N", "1", "-n", "1", "-t", "5", "--hold",
                        "-o", str(workdir / "dup.out"), "--wrap", "sleep 60"], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"sbatch of the held job failed: {r.stderr.strip()}")


def cancel_survey_jobs(env: dict[str, str]) -> None:
    rows = subprocess.run(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%j"], capture_output=True, text=True, env=env).stdout
    ids = [l.split("|", 1)[0] for l in rows.splitlines() if "|" in l and l.split("|", 1)[1].startswith(PREFIX)]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, env=env)


def markdown(results: list[dict]) -> str:
    def cell(s) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")[:220]
    rows = ["| id | command | exit | first line of stderr | verdict |", "|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {cell(r['id'])} | `{cell(r['command'])}` | {r['exit']} | {cell(r['first_line'])} | {cell(r['verdict'])} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/bad_inputs.json")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", nargs="+", metavar="TEXT", help="run only the cases whose id contains one of these")
    ap.add_argument("--list", action="store_true", help="list the case ids and exit")
    a = ap.parse_args()
    cases = all_cases()
    if a.list:
        print("\n".join(c.id for c in cases))
        print(f"{len(cases)} cases", file=sys.stderr)
        return
    if a.only:
        cases = [c for c in cases if any(t in c.id for t in a.only)]
    env = base_env()
    work = Path(tempfile.mkdtemp(prefix="bad-inputs-fixture-"))
    job = finished_job(env, work) if any("{JOB}" in " ".join(c.argv) for c in cases) else "0"
    if any(c.id == "real-duplicate-name" for c in cases):
        hold_duplicate(env, work)
    print(f"{len(cases)} cases, {a.workers} workers; fixture job {job}", flush=True)
    results: list[dict] = []
    order = {c.id: i for i, c in enumerate(cases)}
    try:
        with ThreadPoolExecutor(a.workers) as pool:
            futures = [pool.submit(run_case, c, job, env) for c in sorted(cases, key=lambda c: c.timeout != TRAIN_TIMEOUT_S)]
            for n, f in enumerate(as_completed(futures), 1):
                r = f.result()
                results.append(r)
                print(f"[{n}/{len(cases)}] {r['id']}: exit {r['exit']} {r['seconds']} s -> {r['verdict']} | {r['first_line'][:200]}",
                      flush=True)
    finally:
        cancel_survey_jobs(env)
    results.sort(key=lambda r: order[r["id"]])
    good = sum(r["verdict"] == "good" for r in results)
    print()
    print(markdown(results))
    print()
    print(f"cases: {len(results)}; handled well: {good}; not: {len(results) - good}")
    Path(a.out).write_text(json.dumps({"cases": len(results), "good": good, "bad": len(results) - good,
                                        "results": results}, indent=1, ensure_ascii=False))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
