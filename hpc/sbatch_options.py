"""sbatch's long options per supported Slurm version, and what a profile's ``submission.extra_sbatch`` may add.

sbatch reads its options with getopt_long: an exact name, or any prefix that starts one option only (or several that
are the same option: ``tasks`` is ``--ntasks-per-node`` through its alias ``tasks-per-node``); a prefix of several is
refused as ambiguous. The tables are the options of each version's ``src/common/slurm_opt.c`` that sbatch takes
(22.05.8, 24.11.7, 26.05.3); the local cluster's ``sbatch --help`` (22.05) lists a subset of the first
(tests/unit/data/sbatch-22.05-help.txt, tests/unit/test_sbatch_options.py). An extra_sbatch key is read as every
supported version reads it, so a prefix that is ``--no-kill`` on one of them is refused on all.
"""

from __future__ import annotations

from typing import Optional, Union

from hpc.node.cli import shown

VALUE, FLAG, EITHER = "value", "flag", "either"  # required_argument, no_argument, optional_argument

SLURM_22_05 = {
    **dict.fromkeys(
        (
            "account", "acctg-freq", "array", "batch", "bb", "bbf", "begin", "chdir", "cluster", "cluster-constraint",
            "clusters", "comment", "constraint", "container", "context", "core-spec", "cores-per-socket", "cpu-freq",
            "cpus-per-gpu", "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "error",
            "exclude", "export", "export-file", "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus",
            "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "hint", "input", "job-name",
            "kill-on-invalid-dep", "licenses", "mail-type", "mail-user", "mcs-label", "mem", "mem-bind",
            "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nodefile", "nodelist", "nodes", "ntasks",
            "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket", "ntasks-per-tres",
            "open-mode", "output", "partition", "power", "prefer", "priority", "profile", "qos", "reservation",
            "signal", "sockets-per-node", "switches", "tasks-per-node", "thread-spec", "threads-per-core", "time",
            "time-min", "tmp", "uid", "wait-all-nodes", "wckey", "wrap",
        ),
        VALUE,
    ),
    **dict.fromkeys(
        (
            "contiguous", "help", "hold", "ignore-pbs", "no-requeue", "overcommit", "oversubscribe", "parsable",
            "quiet", "reboot", "requeue", "spread-job", "test-only", "usage", "use-min-nodes", "verbose", "version",
            "wait",
        ),
        FLAG,
    ),
    **dict.fromkeys(("exclusive", "get-user-env", "nice", "no-kill", "propagate"), EITHER),
}  # fmt: skip
SLURM_24_11 = {
    **{k: v for k, v in SLURM_22_05.items() if k != "power"},
    **dict.fromkeys(("autocomplete", "container-id", "extra", "segment", "tres-bind", "tres-per-task"), VALUE),
    "stepmgr": FLAG,
    **dict.fromkeys(("oom-kill-step", "resv-ports"), EITHER),
}
SLURM_26_05 = {
    **SLURM_24_11,
    **dict.fromkeys(("container-type", "mem-update", "resources"), VALUE),
    **dict.fromkeys(("consolidate-segments", "external", "get-user-env", "spread-segments"), FLAG),
    "requeue": EITHER,
}
VERSIONS = {"22.05": SLURM_22_05, "24.11": SLURM_24_11, "26.05": SLURM_26_05}
ALIASES = {"tasks-per-node": "ntasks-per-node"}  # the same getopt entry (has_arg and val): never ambiguous together

# what hpc.submit renders itself (its flags, the profile's own keys): never from extra_sbatch
RENDERED = (
    "job-name", "partition", "nodes", "ntasks", "ntasks-per-node", "gpus-per-node", "gpus", "gres", "cpus-per-task",
    "time", "chdir", "open-mode", "signal", "requeue", "no-requeue", "no-kill", "array", "dependency", "mem",
    "account", "qos", "output", "error", "nodelist", "exclude", "gres-flags",
)  # fmt: skip
REFUSED = {
    **dict.fromkeys(
        ("gpu-bind", "gpus-per-task", "gpus-per-socket", "tres-per-task", "tres-bind", "ntasks-per-gpu",
         "ntasks-per-tres", "cpus-per-gpu"),
        "binds tasks to GPUs and CPUs, which the partition's keys do (partitions[].gpu_request, gpu_bind, cpu_bind, "
        "gres_flags; --cpus-per-task and --ntasks-per-node are rendered)",
    ),
    **dict.fromkeys(
        ("mem-per-cpu", "mem-per-gpu"),
        "Slurm takes one of --mem (partitions[].mem_per_node_gb), --mem-per-cpu, --mem-per-gpu",
    ),
    "nodefile": "selects the job's nodes, which hpc.submit --nodelist and --exclude do",
    "wrap": "the job is a script of its own",
    **dict.fromkeys(
        ("clusters", "cluster"),
        "the job would run on another cluster, where hpc.jobs and the requeue do not find it "
        "(submission.slurm_conf names the profile's cluster)",
    ),
    **dict.fromkeys(
        ("wait", "test-only", "help", "usage", "version", "parsable", "quiet"),
        "changes what sbatch does or prints when hpc.submit submits (it reads the job id sbatch prints; "
        "--dry-run and --test-only are its own flags)",
    ),
}  # fmt: skip
# options sbatch refuses (or ignores one of) when given together
EXCLUSIVE = (
    ("exclusive", "oversubscribe"),
    ("core-spec", "thread-spec"),
    *(("hint", o) for o in ("ntasks-per-core", "cores-per-socket", "threads-per-core", "sockets-per-node",
                            "extra-node-info")),
)  # fmt: skip
PARTITION_KEYS = ("cpu-bind",)  # an srun option, not sbatch's: partitions[].cpu_bind


def resolve(key: str, options: dict[str, str]) -> Optional[str]:
    """The option of ``options`` that sbatch reads ``key`` as (aliases by the option they are); None when it starts
    none (a SPANK plugin's option, e.g. pyxis' container-image); ValueError when it starts several."""
    if key in options:
        return ALIASES.get(key, key)
    found = sorted({ALIASES.get(o, o) for o in options if o.startswith(key)})
    if len(found) > 1:
        raise ValueError(", ".join(found))
    return found[0] if found else None


def accepted_prefixes(option: str, options: dict[str, str]) -> list[str]:
    """Every key sbatch reads as ``option`` (itself and its aliases' prefixes that start no other option)."""
    names = [o for o in options if ALIASES.get(o, o) == option]
    keys = {n[:i] for n in names for i in range(1, len(n) + 1)}
    out = []
    for key in sorted(keys):
        try:
            if resolve(key, options) == option:
                out.append(key)
        except ValueError:
            pass
    return out


def read_key(key: str) -> dict[str, str]:
    """What each supported version reads ``key`` as ({version: option}, versions where it starts none left out);
    ValueError naming the versions where it is ambiguous."""
    read = {}
    for version, options in VERSIONS.items():
        try:
            option = resolve(key, options)
        except ValueError as e:
            raise ValueError(
                f"{shown(key)} is a prefix of several sbatch options (Slurm {version}: {e}), which sbatch refuses as "
                "ambiguous; write the whole option"
            ) from None
        if option is not None:
            read[version] = option
    return read


def check_extra_sbatch(options: dict[str, Union[str, bool]]) -> dict[str, Union[str, bool]]:
    """extra_sbatch as sbatch would read it on every supported version; ValueError (one line) naming the key when it
    is, or is a prefix of, an option hpc.submit renders or whose effect defeats the script, a value for an option that
    takes none (or none for one that needs one), or two options sbatch refuses together."""
    seen: dict[str, str] = {}
    for key, value in options.items():
        if value is False:
            raise ValueError(f"{shown(key)}: false; give a flag as true, or leave it out")
        if key in PARTITION_KEYS:
            raise ValueError(f"{shown(key)} is a partition's key here: partitions[].{key.replace('-', '_')}")
        read = read_key(key)
        for version, option in read.items():
            named = shown(key) if option == key else f"{shown(key)} (sbatch {version} reads it as --{option})"
            if option in RENDERED:
                raise ValueError(f"{named} is set by hpc.submit (from its flags and the profile's own keys)")
            if option in REFUSED:
                raise ValueError(f"{named} cannot be given here: {REFUSED[option]}")
            kind = VERSIONS[version][option if option in VERSIONS[version] else key]
            if value is True and kind == VALUE:
                raise ValueError(f"{named} needs a value (--{option}=VALUE), not true")
            if value is not True and kind == FLAG:
                raise ValueError(f"{named} takes no value in Slurm {version}: give it as {key}: true")
            if option == "export" and str(value).split(",")[0] != "ALL":
                raise ValueError(
                    f"{named}={shown(str(value))}: the job's steps need the submitting environment; allowed: ALL or "
                    "ALL,NAME=VALUE,..."
                )
            seen.setdefault(option, key)
    for a, b in EXCLUSIVE:
        if a in seen and b in seen:
            raise ValueError(f"{shown(seen[a])} and {shown(seen[b])}: sbatch refuses --{a} and --{b} together")
    return options
