"""Which failures of a job's ranks restart them within the job (on the allocation's healthy nodes, a spare taking a
bad node's place), which end the job, and which go back to the queue: the decision table of `hpc.node.restart`.

What ended an attempt is judged from what its tasks and ranks left (`hpc.node.attempt`): the first failure in time
is the cause, the failures it brought on in the other ranks (their collectives failing) are not. Its ``Kind`` (each
member saying what ended the ranks) and ``decide`` make the table that docs/spares.md shows
(``python scripts/gen_restart_table.py`` writes it).

A node named by a failure leaves the job once it has caused ``max_restarts_per_node`` restarts (until then it goes back
to the spares, behind those that never failed); a job restarts at most ``max_restarts`` times in all. When a restart
is due but the limit is reached or fewer healthy nodes than the job's are left, the job falls back to the requeue
without the named nodes (the batch script's, within its own limits).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from hpc.node.attempt import Records
from hpc.node.contract import EXIT_BAD_INPUT, EXIT_NO_RESTART, EXIT_NODE_FAULT, EXIT_STOPPED


class _Word(str, Enum):
    """Members that are their words: in the records (JSON), the log lines and comparisons with strings."""

    def __str__(self) -> str:
        return self.value


class Kind(_Word):
    """What ended an attempt; ``what`` says it in the words of the decision table."""

    DONE = "done"
    STOPPED = "stopped"
    STRAGGLER = "straggler"
    HANG = "hang"
    DIED = "died"
    VANISHED = "vanished"
    NODE_FAULT = "node fault"  # suspected: the node's GPU checks decide whether it is the node's
    BAD_INPUT = "bad input"
    NO_RESTART = "no restart"
    ERROR = "error"
    UNKNOWN = "unknown"

    @property
    def what(self) -> str:
        return _WHAT[self]


_WHAT = {
    Kind.DONE: "every rank reached the end",
    Kind.STOPPED: "a clean stop (exit 75: the time limit, a preemption)",
    Kind.STRAGGLER: "a persistent straggler's stop (`preemption.exclude_stragglers_after`): its node was marked",
    Kind.HANG: "a rank's heartbeat went silent past its phase's deadline (`hpc.node.hang_deadlines`), or a collective "
    "timed out: the ranks missing at it are named (a hung, stopped or stuck process, a node gone quiet)",
    Kind.DIED: "a rank's process killed by a signal (SIGKILL, SIGSEGV, SIGBUS, SIGABRT, ...)",
    Kind.VANISHED: "a node's ranks all ended without a record (its processes killed at once, or the node gone), or "
    "Slurm took the node out of the job (set DOWN, or not answering, under `--no-kill`): the step was killed with it",
    Kind.NODE_FAULT: "a rank ended on a suspected node fault (exit 94, `hpc.node.contract.EXIT_NODE_FAULT`): by the "
    "fault table (`hpc.node.fault_table`), an error of its GPU, driver, link or network",
    Kind.BAD_INPUT: "bad input (exit 2)",
    Kind.NO_RESTART: 'exit 93 (`hpc.node.contract.EXIT_NO_RESTART`): a rank program\'s "do not restart or requeue me"',
    Kind.ERROR: "a rank program failed by itself: a Python exception the fault table calls the program's, "
    "`sys.exit(1)`, any other exit code",
    Kind.UNKNOWN: "the step failed and nothing names a rank or node",
}
NAMES_A_NODE = (Kind.STRAGGLER, Kind.HANG, Kind.DIED, Kind.VANISHED)  # restarted without the node(s) named
NEVER = (Kind.BAD_INPUT, Kind.NO_RESTART, Kind.ERROR)  # the program's own failure: never restarted or requeued


class Action(_Word):
    """What follows a decision: restart the ranks in the job, the job is done, stop (the batch script requeues),
    end (the job failed), or requeue without the named nodes."""

    RESTART = "restart"
    DONE = "done"
    STOP = "stop"
    END = "end"
    REQUEUE = "requeue"


@dataclass(frozen=True)
class Failure:
    """What ended an attempt: its kind, the nodes it names, one line saying so, when it happened (the system's
    estimate: a process's end, or the start of the step that never finished), when it was first seen, and the exit
    code it leaves."""

    kind: Kind
    nodes: tuple[str, ...] = ()
    what: str = ""
    at: Optional[float] = None
    rc: int = 0
    seen: Optional[float] = None
    signature: str = ""  # a node fault's exception type and code (the same error, wherever it comes back)
    confirmed: Optional[bool] = None  # a node fault: whether its node then failed its GPU checks (None: not checked)


def _fine(rc: int) -> bool:
    return rc in (0, EXIT_STOPPED)


def _rank_level(records: Records) -> list[dict]:
    """The exit records that say how each rank ended (under torchrun/accelerate the per-node launchers' records
    only say that one of their ranks failed); the task records where no rank left one."""
    ranks = [e for e in records.exits if e.get("rank") is not None]
    return ranks if ranks else list(records.exits)


def _gone(records: Records) -> list[int]:
    """The ranks a failed collective named missing whose node left no sign of life (no rank of it left an exit
    record or a collective note): their processes gone with their supervisors, the node's processes killed at once or
    the node itself gone. A rank named missing beside a rank of its node that answered was only slower to fail."""
    where = _where(records)
    alive = {n["rank"] for n in records.notes} | {e.get("rank") for e in records.exits}
    live_nodes = (
        {where.get(r) for r in alive} | {e.get("node") for e in records.exits} | {n["node"] for n in records.notes}
    )
    named = {r for n in records.notes for r in n.get("missing") or []}
    return sorted(r for r in named - alive if where.get(r) not in live_nodes)


def _unreported(records: Records, world: int) -> list[int]:
    """Ranks that left neither a collective note nor an exit record (used when the store did not answer)."""
    seen = {n["rank"] for n in records.notes} | {e.get("rank") for e in records.exits}
    return [r for r in range(world) if r not in seen]


def _where(records: Records) -> dict:
    """Each rank's node: from the start records and the nodes a collective note lists."""
    where = {s.get("rank"): s.get("node") for s in records.starts if s.get("rank") is not None}
    for n in records.notes:
        where.update(enumerate(n.get("nodes") or []))
    return where


def _nodes_of(ranks: list[int], records: Records) -> tuple[str, ...]:
    where = _where(records)
    return tuple(sorted({where[r] for r in ranks if where.get(r)}))


def judge(records: Records, stopped: bool, rc: Optional[int], world: int) -> Failure:
    """What ended the attempt (see the module's table). ``stopped``: the ranks left the stop record; ``rc``: srun's
    exit code (None when the supervisor ended the step); ``world``: the ranks the attempt started."""
    exits = _rank_level(records)
    for code, kind in ((EXIT_BAD_INPUT, Kind.BAD_INPUT), (EXIT_NO_RESTART, Kind.NO_RESTART)):
        hit = sorted((e for e in exits if e.get("rc") == code and not e.get("signal")), key=lambda e: e["at"])
        if hit:
            e = hit[0]
            what = "bad input" if code == EXIT_BAD_INPUT else "do not restart or requeue"
            return Failure(
                kind, (e["node"],), f"{e['who']} ended with exit code {code} ({what})", e["at"], code, e["at"]
            )
    noted = {n["rank"] for n in records.notes}
    events: list[Failure] = []
    for e in exits:
        if _fine(e.get("rc", 0)):
            continue
        if e.get("signal"):
            events.append(
                Failure(
                    Kind.DIED,
                    (e["node"],),
                    f"{e['who']} was killed by {e['signal']} (exit {e['rc']})",
                    e["at"],
                    e["rc"],
                    e["at"],
                )
            )
        elif (e.get("rc") == EXIT_NODE_FAULT or _per_node_fault(e, records)) and (
            e.get("rank") is None or e["rank"] not in noted
        ):
            fault = _fault_record(e, records)
            signature = fault.get("signature") or f"exit {EXIT_NODE_FAULT}"
            what = f" ({fault['what']})" if fault.get("what") else ""
            events.append(
                Failure(
                    Kind.NODE_FAULT,
                    (e["node"],),
                    f"{e['who']} ended on a suspected node fault: {signature}{what}",
                    e["at"],
                    e["rc"],
                    e["at"],
                    signature,
                )
            )
        elif e.get("rank") is None or e["rank"] not in noted:  # not a collective's victim: the program's own failure
            events.append(
                Failure(
                    Kind.ERROR,
                    (e["node"],),
                    f"{e['who']} ended with exit code {e['rc']} without a failed collective (an error in the program)",
                    e["at"],
                    e["rc"],
                    e["at"],
                )
            )
    if records.notes:
        first = min(records.notes, key=lambda n: n["failed_at"])
        step = f" after step {first['step']}" if first.get("step") is not None else ""
        if any(n.get("failure") == "timeout" for n in records.notes):
            missing = sorted({r for n in records.notes for r in n.get("missing") or []})
            if all(n.get("arrived") is None for n in records.notes):  # the store did not answer: who said nothing
                missing = _unreported(records, world)
            nodes = _nodes_of(missing, records)
            if missing:
                events.append(
                    Failure(
                        Kind.HANG,
                        nodes,
                        f"a collective timed out{step}: {_ranks_on(missing, nodes)} did not arrive",
                        first["step_started_at"],
                        1,
                        first["failed_at"],
                    )
                )
        else:
            gone = _gone(records)
            nodes = _nodes_of(gone, records)
            if gone:
                events.append(
                    Failure(
                        Kind.VANISHED,
                        nodes,
                        f"{_ranks_on(gone, nodes)} ended{step} without an exit "
                        "record (the node's processes killed at once, or the node gone)",
                        first["failed_at"],
                        1,
                        first["failed_at"],
                    )
                )
    if events:
        return min(events, key=lambda f: f.seen)
    if stopped:
        if records.marked:
            return Failure(
                Kind.STRAGGLER,
                tuple(records.marked),
                f"the ranks stopped with a checkpoint after "
                f"{', '.join(records.marked)} was marked bad (a persistent straggler)",
                records.progress.get("step_at"),
                0,
                records.progress.get("step_at"),
            )
        return Failure(
            Kind.STOPPED, (), "the ranks stopped with a checkpoint saved (the time limit or a preemption)", None, 0
        )
    if rc == 0:
        return Failure(Kind.DONE, (), "every rank reached the end", None, 0)
    return Failure(
        Kind.UNKNOWN, (), f"the ranks ended with exit code {rc}, and no rank or node is named", None, rc or 1
    )


def _per_node_fault(exit_record: dict, records: Records) -> bool:
    """A per-node launcher (torchrun, accelerate) failed, which exits 1 whatever its ranks' codes, and one of its
    ranks left a suspected node fault's record."""
    return exit_record.get("rank") is None and _fault_record(exit_record, records).get("cause") == "node"


def _fault_record(exit_record: dict, records: Records) -> dict:
    """The fault record a rank left with its exit 94 (`hpc.node.fault_exit`); under a per-node launcher, one of its
    node's ranks'."""
    rank = exit_record.get("rank")
    return next(
        (
            f
            for f in sorted(records.faults, key=lambda f: f.get("at", 0))
            if (f.get("rank") == rank if rank is not None else f.get("node") == exit_record.get("node"))
        ),
        {},
    )


def _ranks_on(ranks: list[int], nodes: tuple[str, ...]) -> str:
    what = "rank " + str(ranks[0]) if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    return f"{what} on {', '.join(nodes)}" if nodes else what


def left_the_job(failure: Failure, gone: list[str], now: float) -> Failure:
    """``failure`` once Slurm took ``gone``, nodes the attempt ran on, out of the job (a node set DOWN, or not
    answering, under ``--no-kill``): Slurm killed the ranks' step with it, so what the killed ranks left names no
    cause; the nodes vanished. A clean end or stop stays what it was."""
    if not gone or failure.kind in (Kind.DONE, Kind.STOPPED):
        return failure
    return Failure(
        Kind.VANISHED,
        tuple(sorted(gone)),
        f"{', '.join(sorted(gone))} left the job's allocation (Slurm took the node out: DOWN or not responding) and "
        "the ranks' step was killed with it",
        failure.at if failure.at is not None else now,
        failure.rc or 1,
        now,
    )


def decisive(records: Records, world: int) -> bool:
    """Whether the attempt's records already say what ended it, so the rest of its ranks may be ended now: the
    program's own end (bad input, no restart, an error) or a process killed, or every rank accounted for (a
    record, a collective note, or named missing in one)."""
    exits = _rank_level(records)
    if any(
        not _fine(e.get("rc", 0))
        and (
            e.get("signal")
            or e.get("rc") in (EXIT_BAD_INPUT, EXIT_NO_RESTART, EXIT_NODE_FAULT)
            or e.get("rank") not in {n["rank"] for n in records.notes}
        )
        for e in exits
    ):
        return True
    if not records.notes:
        return False
    seen = {n["rank"] for n in records.notes} | {e.get("rank") for e in exits}
    if any(n.get("failure") == "timeout" for n in records.notes):
        seen |= {r for n in records.notes for r in n.get("missing") or []}  # stopped or hung: they will not report
    else:
        seen |= set(_gone(records))  # a peer ended: the missing on a live node are still failing
    return all(r in seen for r in range(world))


@dataclass
class History:
    """The job's in-job restarts so far (all its runs): how many, how many of unknown cause, how many each node
    caused (a node fault only where the node failed its GPU checks), and the nodes each node fault's error restarted
    the ranks from."""

    restarts: int = 0
    unattributed: int = 0
    caused: Counter = field(default_factory=Counter)
    node_faults: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, decisions: list[dict]) -> "History":
        h = cls()
        for d in decisions:
            if d.get("action") != Action.RESTART:
                continue
            h.restarts += 1
            h.unattributed += d.get("kind") == Kind.UNKNOWN
            if d.get("kind") == Kind.NODE_FAULT:
                h.node_faults.setdefault(d.get("signature") or "", set()).update(d.get("nodes") or [])
                if not d.get("confirmed"):
                    continue
            h.caused.update(d.get("nodes") or [])
        return h

    def came_back(self, failure: Failure) -> list[str]:
        """The other nodes where ``failure``'s error (a node fault) restarted the ranks before; none: a first."""
        before = self.node_faults.get(failure.signature, set())
        return sorted(before - set(failure.nodes))


@dataclass(frozen=True)
class Limits:
    max_restarts: int
    max_restarts_per_node: int


@dataclass(frozen=True)
class Decision:
    action: Action
    why: str
    out: tuple[str, ...] = ()  # nodes that leave the job now (caused max_restarts_per_node restarts)


def decide(failure: Failure, history: History, limits: Limits, usable: set[str], needed: int) -> Decision:
    """What to do after ``failure``: ``history`` before it; ``usable``: the allocation's nodes not out of the job
    before it; ``needed``: the nodes the ranks run on."""
    kind = failure.kind
    if kind == Kind.DONE:
        return Decision(Action.DONE, "the job is done")
    if kind == Kind.STOPPED:
        return Decision(Action.STOP, "stopped with a checkpoint saved: requeued by the batch script")
    if kind in NEVER:
        reason = {
            Kind.BAD_INPUT: "bad input is never restarted",
            Kind.NO_RESTART: "the program asked not to be restarted or requeued",
            Kind.ERROR: "an error in the program is never restarted",
        }[kind]
        return Decision(Action.END, f"not restarted: {reason}")
    if kind == Kind.NODE_FAULT and history.came_back(failure):
        return Decision(
            Action.END,
            f"not restarted: the same error ({failure.signature}) came back on {', '.join(failure.nodes)} after it "
            f"restarted the ranks off {', '.join(history.came_back(failure))}: the program's error",
        )
    if history.restarts >= limits.max_restarts:
        return Decision(
            Action.REQUEUE if kind in NAMES_A_NODE or failure.confirmed else Action.END,
            f"not restarted: the job has restarted {history.restarts} time(s), at most {limits.max_restarts}",
        )
    if kind == Kind.UNKNOWN:
        if history.unattributed >= 1:
            return Decision(
                Action.END,
                "not restarted: a failure of unknown cause restarts at most once per job, and this is the second",
            )
        return Decision(Action.RESTART, "a failure of unknown cause: restarted once, on the same nodes")
    if kind == Kind.NODE_FAULT and not failure.confirmed:
        return Decision(
            Action.RESTART,
            "restarted: the node passed its GPU checks, so it stays (behind the spares) and the restart is not counted "
            "against it",
        )
    if kind == Kind.NODE_FAULT:
        out = failure.nodes  # its GPUs failed their checks: it leaves the job now
    else:
        out = tuple(n for n in failure.nodes if history.caused[n] + 1 >= limits.max_restarts_per_node)
    healthy = len(usable - set(out))
    if healthy < needed:
        return Decision(Action.REQUEUE, f"not restarted: {healthy} healthy node(s) left, the ranks need {needed}", out)
    if kind == Kind.NODE_FAULT:
        return Decision(Action.RESTART, "restarted without the node: its GPUs failed their checks", out)
    return Decision(Action.RESTART, "restarted on the allocation's healthy nodes", out)


def place(
    allocation: list[str], previous: list[str], out: set[str], avoid: set[str], caused: Counter, needed: int
) -> Optional[list[str]]:
    """The nodes of the next attempt, in the allocation's order: the previous attempt's nodes that are neither out
    nor to be avoided (the nodes the failure named), then the spares that never failed, then those that caused the
    fewest restarts, the avoided ones last; None when fewer than ``needed`` nodes are usable."""
    usable = [n for n in allocation if n not in out]
    if len(usable) < needed:
        return None
    keep = [n for n in previous if n in usable and n not in avoid][:needed]
    spares = sorted((n for n in usable if n not in keep), key=lambda n: (n in avoid, caused[n], allocation.index(n)))
    chosen = set(keep + spares[: needed - len(keep)])
    return [n for n in allocation if n in chosen]
