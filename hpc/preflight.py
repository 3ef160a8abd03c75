"""python -m hpc.preflight: is the network of these nodes what the site profile says?

    python -m hpc.preflight --site ib-h200 --nodes 4 [--partition P] [--gpus-per-node G]
        [--nodelist NODES] [--exclude NODES] [--min-fraction 0.5] [--out DIR] [--min-bytes B] [--max-bytes B] [--iters
        N]

Submits a short job (the site's sbatch script, ranks started by hpc.node.launch, which first
checks each node's interfaces and HCAs) running hpc.node.preflight_node on every rank; follows
it; prints each node's facts and GPU health (hpc.node.health), all_reduce bus bandwidth per
message size over all ranks, each node and each node pair; flags slow nodes and links; writes
DIR/preflight-<job>.json and .png. Exit 0: passed; 1: the job failed, bandwidth is below
--min-fraction of the profile's network.expected, or a node or link is below --min-fraction
of its peers or unhealthy (the --exclude to submit with is printed); 2: bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import hostlist

from hpc.job_outcome import LOG_TAIL_BYTES
from hpc.node.bandwidth import MAX_BYTES, MAX_ITERS, human_bytes
from hpc.node.cli import HpcError, Parser, error_line, fail, number, path_text, whole
from hpc.node.contract import ENDED_STATES, EXIT_FAILED, PREFLIGHT_RESULT, task_log
from hpc.node.files import META_BYTES, NotASmallFile, read_json_object, read_range
from hpc.node.health import Finding
from hpc.node.launch import PROG as LAUNCH_PROG
from hpc.node.ownership import run_dir_name
from hpc.site import load_site
from hpc.slurm_query import JobError, run_slurm
from hpc.spec import SpecError, add_allocation_args, build_spec, check_gpu_partition, site_path
from hpc.submitter import follow, submit

PROG = "hpc.preflight"
JOB_NAME = "preflight"  # its directory (run_dir_name) is the default --out


def peak(rows: list[dict]) -> float:
    """Bus bandwidth at the largest message size (GB/s)."""
    return rows[-1]["busbw_gbps"]


def outliers(values: dict[str, float], fraction: float) -> list[str]:
    """Keys whose value is below fraction x the median of the others (needs at least two others)."""
    return [
        k
        for k, v in values.items()
        if len(values) > 2 and v < fraction * statistics.median(x for j, x in values.items() if j != k)
    ]


def exclusions(
    names: list[str], bad_nodes: list[str], slow_links: list[list[str]], link_score: dict[str, float]
) -> list[str]:
    """The nodes to exclude: slow or unhealthy nodes, and for each slow link between good nodes its end whose links are
    slower (both ends when they are equal)."""
    out = set(bad_nodes)
    for x, y in slow_links:
        if x in out or y in out:
            continue
        out |= {x, y} if link_score[x] == link_score[y] else {min((x, y), key=link_score.get)}
    return [n for n in names if n in out]


def analyze(raw: dict, intra_expected: Optional[float], inter_expected: Optional[float], min_fraction: float) -> dict:
    """Compare with the profile and with peers; `failed` when below min_fraction of the expected bandwidth."""
    lines, failed, warnings = [], False, []
    size = human_bytes(raw["sizes"][-1])
    members = {f"{p['nodes'][0]}-{p['nodes'][1]}": p["nodes"] for p in raw["pairs"]}
    pairs = {f"{p['nodes'][0]}-{p['nodes'][1]}": peak(p["rows"]) for p in raw["pairs"]}
    intra = {name: peak(rows) for name, rows in raw["intra"].items()}

    def compare(what: str, measured: Optional[float], expected: Optional[float], key: str) -> None:
        nonlocal failed
        if measured is None:
            return
        if expected is None:
            lines.append(
                f"{what}: {measured:.3g} GB/s at {size}; the profile has no network.expected.{key}: nothing to compare"
            )
        elif measured < min_fraction * expected:
            failed = True
            lines.append(
                f"{what}: {measured:.3g} GB/s at {size} is below {min_fraction:g} x the expected {expected:g} GB/s: "
                "FAIL"
            )
        else:
            lines.append(
                f"{what}: {measured:.3g} GB/s at {size}, {measured / expected:.0%} of the expected {expected:g} GB/s: "
                "ok"
            )

    if len(raw["nodes"]) > 1:
        worst = min([peak(raw["all"]), *pairs.values()])
        compare("inter-node busbw (slowest of all ranks and node pairs)", worst, inter_expected, "inter_node_gbps")
    else:
        lines.append("one node: no inter-node link measured")
    if intra:
        name = min(intra, key=intra.get)
        compare(f"intra-node busbw (slowest node, {name})", intra[name], intra_expected, "intra_node_gbps")
    else:
        lines.append("one rank per node: no intra-node bandwidth measured")

    names = [n["name"] for n in raw["nodes"]]
    link_score = {n: statistics.median(v for k, v in pairs.items() if n in members[k]) for n in names if len(names) > 1}
    slow_links = outliers(pairs, min_fraction)
    slow_nodes = [n for n in names if n in outliers(intra, min_fraction) or n in outliers(link_score, min_fraction)]
    for k in slow_links:
        warnings.append(f"slow link {k}: {pairs[k]:.3g} GB/s, below {min_fraction:g} x the other pairs' median")
    for n in slow_nodes:
        warnings.append(
            f"slow node {n}: its intra-node bandwidth or its links are below {min_fraction:g} x the other nodes' median"
        )
    unhealthy = [n["name"] for n in raw["nodes"] if any(not f["ok"] for f in (n.get("facts") or {}).get("health", []))]
    for n in unhealthy:
        warnings.append(f"unhealthy node {n}: it failed a GPU health check (its [health] lines above)")
    exclude = exclusions(names, slow_nodes + unhealthy, [members[k] for k in slow_links], link_score)
    if exclude:
        failed = True
    if len(pairs) == 1:
        lines.append("one node pair: no peers to compare links with")
    return {
        "pairs_peak_gbps": pairs,
        "intra_peak_gbps": intra,
        "slow_links": slow_links,
        "slow_nodes": slow_nodes,
        "unhealthy_nodes": unhealthy,
        "exclude": hostlist.collect_hostlist(exclude) if exclude else None,
        "verdict": lines,
        "warnings": warnings,
        "failed": failed,
        "min_fraction": min_fraction,
    }


def tables(raw: dict) -> str:
    """Per-node facts, then busbw per size (all ranks, each node), then node pairs."""
    out = [f"{'node':<8} {'host':<10} {'interfaces with an address':<44} {'HCA ports':<18} {'GPUs':<16} uses"]
    for n in raw["nodes"]:
        f = n["facts"]
        ifs = "; ".join(f"{i['name']} {','.join(i['addrs'])}" for i in f["interfaces"] if i["addrs"])
        hcas = ", ".join(f"{p['device']}:{p['port']} {p['state']}" for p in f["hca_ports"]) or "-"
        gpus = (
            f"{len(f['cuda_gpus'])}x {f['cuda_gpus'][0]['name']}"
            if f["cuda_gpus"]
            else f"slurm: {f['slurm_gpus']}"
            if f["slurm_gpus"]
            else "-"
        )
        out.append(f"{n['name']:<8} {f['hostname']:<10} {ifs:<44} {hcas:<18} {gpus:<16} {f['selected']}")
    cols = [(f"all {raw['world_size']} ranks", raw["all"])]
    cols += [
        (f"{name} ({len(next(n for n in raw['nodes'] if n['name'] == name)['ranks'])})", rows)
        for name, rows in raw["intra"].items()
    ]
    out += [
        "",
        f"all_reduce bus bandwidth, GB/s ({raw['backend']} on {raw['device']}, {raw['iters']} iterations per size)",
        f"{'size':>8} " + " ".join(f"{c:>14}" for c, _ in cols),
    ]
    for i, size in enumerate(raw["sizes"]):
        out.append(f"{human_bytes(size):>8} " + " ".join(f"{rows[i]['busbw_gbps']:14.3f}" for _, rows in cols))
    if raw["pairs"]:
        psizes = [r["bytes"] for r in raw["pairs"][0]["rows"]]
        out += ["", "node pairs, busbw GB/s", f"{'pair':<12} " + " ".join(f"{human_bytes(s):>10}" for s in psizes)]
        for p in raw["pairs"]:
            out.append(f"{'-'.join(p['nodes']):<12} " + " ".join(f"{r['busbw_gbps']:10.3f}" for r in p["rows"]))
    return "\n".join(out)


def plot(raw: dict, intra_expected: Optional[float], inter_expected: Optional[float], path: Path) -> None:
    """busbw against message size: all ranks, each node, each pair, and the expected lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    curves = [(f"all {raw['world_size']} ranks", raw["all"], "-o")]
    curves += [(f"node {k}", v, "--.") for k, v in raw["intra"].items()]
    curves += [(f"pair {'-'.join(p['nodes'])}", p["rows"], ":s") for p in raw["pairs"]]
    for label, rows, style in curves:
        ax.plot([r["bytes"] for r in rows], [r["busbw_gbps"] for r in rows], style, label=label)
    for value, label in ((intra_expected, "expected intra-node"), (inter_expected, "expected inter-node")):
        if value:
            ax.axhline(
                value, color="gray", linestyle="-." if "intra" in label else "--", label=f"{label} {value:g} GB/s"
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(raw["sizes"], [human_bytes(s) for s in raw["sizes"]], rotation=45)
    ax.set_xlabel("message size")
    ax.set_ylabel("all_reduce bus bandwidth (GB/s)")
    ax.set_title(f"preflight job {raw['job_id']}: {raw['backend']} on {raw['device']}, {len(raw['nodes'])} node(s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def failure_line(logs: list[Path]) -> str:
    """The most telling line of the job's logs: hpc.node.launch's own error, else the last error-looking line."""
    texts = []
    for p in logs:
        try:
            texts.append(read_range(p, None, LOG_TAIL_BYTES)[0].decode("utf-8", errors="replace"))
        except (OSError, NotASmallFile):  # missing, or not a regular file (a FIFO would block)
            continue
    for text in texts:
        for line in text.splitlines():
            if line.startswith(error_line(LAUNCH_PROG, "")):
                return line
    errors = [line.strip() for t in texts for line in t.splitlines() if "Error" in line or "error" in line]
    return errors[-1] if errors else "no error message in the logs"


def creatable_dir(path: Path) -> Optional[str]:
    """Why directory ``path`` cannot be made or written (nothing is created), or None."""
    above = next(p for p in (path, *path.parents) if p.exists())
    if not above.is_dir():
        return f"{above} is not a directory"
    if not os.access(above, os.W_OK | os.X_OK):
        return f"{above} is not writable" if above == path else f"cannot create it: {above} is not writable"
    return None


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=f"python -m {PROG}",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_allocation_args(p, "job time limit, Slurm form (default: 10 minutes)", time_default="10")
    p.add_argument(
        "--min-fraction",
        type=number(0, 1, lo_open=True),
        default=0.5,
        help="fail when busbw is below this fraction of network.expected, or a node or link below this fraction of "
        "its peers (default 0.5)",
    )
    p.add_argument("--out", type=path_text, help="directory for the JSON and PNG (default: <job_dir>/preflight)")
    p.add_argument("--min-bytes", type=whole(1, MAX_BYTES), help="smallest message (default: 8 KB on GPU, 4 KB on CPU)")
    p.add_argument("--max-bytes", type=whole(1, MAX_BYTES), help="largest message (default: 1 GB on GPU, 16 MB on CPU)")
    p.add_argument(
        "--iters", type=whole(1, MAX_ITERS), help="timed all_reduces per size (default: 20 on GPU, 5 on CPU)"
    )
    return p


def run(argv: Optional[Sequence[str]]) -> int:
    a = parser().parse_args(argv)
    if a.min_bytes and a.max_bytes and a.min_bytes > a.max_bytes:
        raise SpecError(f"--min-bytes {a.min_bytes} is larger than --max-bytes {a.max_bytes}")
    site = load_site(a.site)
    out = (
        Path(a.out).resolve()
        if a.out is not None
        else site_path(site.paths.job_dir, Path.cwd(), "paths.job_dir") / run_dir_name(JOB_NAME)
    )
    node_args = ["-m", "hpc.node.preflight_node", "--out", str(out)]
    for flag, v in (("--min-bytes", a.min_bytes), ("--max-bytes", a.max_bytes), ("--iters", a.iters)):
        node_args += [flag, str(v)] if v else []
    spec = build_spec(
        site,
        nodes=a.nodes,
        partition=a.partition,
        gpus_per_node=a.gpus_per_node,
        time=a.time,
        job_name=JOB_NAME,
        args=node_args,
        nodelist=a.nodelist,
        exclude=a.exclude,
        spare_nodes=0,
    )  # every node measured: a profile's spares are for training jobs
    check_gpu_partition(site, spec.partition, "--partition")
    health = ["--gpus", str(spec.gpus_per_node)]  # the node program's GPU checks, against the partition's rates
    for flag, v in (("--matmul-tflops", spec.partition.matmul_tflops), ("--copy-gbps", spec.partition.copy_gbps)):
        health += [flag, f"{v:g}"] if v else []
    spec = dataclasses.replace(spec, program=(*spec.program, *health))
    created = not out.exists()
    problem = creatable_dir(out)  # before submitting: an unusable --out is bad input, not a failed job; rank 0 makes it
    if problem:
        raise SpecError(f"--out {out}: {problem}")
    exp = site.network.expected
    job = submit(spec)
    job_id = job.job_id
    rank_logs = [task_log(spec.job_dir, job_id, t) for t in range(spec.nodes * spec.tasks_per_node)]
    print(
        f"submitted preflight job {job_id}: {spec.nodes} node(s) x {spec.tasks_per_node} rank(s), partition "
        f"{spec.partition.name}, site {site.name}; script {job.paths.submission_file}",
        flush=True,
    )
    limit_s = spec.minutes * 60 + 120
    state = follow(
        job_id,
        rank_logs[0],
        prefix="[preflight]",
        deadline=lambda state, started: started is not None and time.time() - started > limit_s,
    )
    if state not in ENDED_STATES:
        try:
            run_slurm(["scancel", job_id])
        except JobError as e:
            print(f"[preflight] scancel {job_id}: {e}", file=sys.stderr)
        state = f"not finished within {limit_s:.0f} s (cancelled)"
    if state != "COMPLETED":
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a failed preflight leaves no empty --out behind
        fail(PROG, f"job {job_id} {state}: {failure_line(rank_logs)} (logs: {spec.job_dir})", EXIT_FAILED)
    raw = read_json_object(out / PREFLIGHT_RESULT.format(job_id=job_id), META_BYTES)
    result = analyze(raw, exp.intra_node_gbps, exp.inter_node_gbps, a.min_fraction)
    print()
    print(tables(raw))
    print()
    for n in raw["nodes"]:
        for f in (n.get("facts") or {}).get("health", []):
            print(Finding(**f).line(n["name"]))
    print()
    for line in result["verdict"] + [f"WARNING: {w}" for w in result["warnings"]]:
        print(line)
    report, png = out / f"preflight-{job_id}.json", out / f"preflight-{job_id}.png"
    report.write_text(json.dumps({**raw, "site": site.name, "analysis": result}, indent=1))
    plot(raw, exp.intra_node_gbps, exp.inter_node_gbps, png)
    print(f"wrote {report} and {png}")
    if result["failed"]:
        if result["exclude"]:
            print(
                f"{PROG}: FAILED: node(s) {result['exclude']} below {a.min_fraction:g} x their peers or unhealthy; "
                f"submit with --exclude {result['exclude']}",
                file=sys.stderr,
            )
        else:
            print(f"{PROG}: FAILED: bandwidth below {a.min_fraction:g} x the profile's expected", file=sys.stderr)
        return EXIT_FAILED
    print("preflight passed")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> None:
    try:
        sys.exit(run(argv))
    except HpcError as e:
        fail(PROG, e)


if __name__ == "__main__":
    main()
