"""The batch host's failure in a job with spare nodes (hpc/node/batch_host.py): read from `scontrol show job -o` as
the local cluster's Slurm 22.05 answered while such a job ended, and the requeue that follows."""

from hpc.node.batch_host import POLL_S, lost_batch_host, requeue_if_batch_host_lost, watch
from hpc.node.tool import ToolResult

# JobState=COMPLETING, n1 (the batch host) set DOWN under --no-kill: Slurm took it out of NodeList.
LOST = (
    "JobId=3 JobName=m.sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 Nice=0 Account=root "
    "QOS=normal JobState=COMPLETING Reason=JobLaunchFailure Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=0:9 RunTime=00:00:04 TimeLimit=02:00:00 TimeMin=N/A Partition=debug "
    "AllocNode:Sid=localhost:2867 ReqNodeList=(null) ExcNodeList=(null) NodeList=n[2-3] BatchHost=n1 NumNodes=2 "
    "NumCPUs=2 NumTasks=2 CPUs/Task=1 Command=/tmp/r-exp/m.sh WorkDir=/tmp/r-exp"
)


def test_a_batch_host_out_of_the_jobs_nodes_is_lost():
    assert lost_batch_host(LOST) == "n1"


def test_a_batch_host_still_held_or_a_job_not_requeueable_is_not():
    assert lost_batch_host(LOST.replace("NodeList=n[2-3]", "NodeList=n[1-3]")) is None  # scancel, a time limit
    assert lost_batch_host(LOST.replace("Requeue=1", "Requeue=0")) is None
    assert lost_batch_host(LOST.replace("NodeList=n[2-3]", "NodeList=(null)")) == "n1"
    assert lost_batch_host(LOST.replace("BatchHost=n1", "BatchHost=(null)")) is None
    assert lost_batch_host("") is None


def answering(show: str, calls: list):
    """scontrol's answers in place of the tool (the local cluster's test runs it): ``show`` to `show job`."""

    def run(argv, timeout_s):
        calls.append(argv[1:])
        return ToolResult(0, show if argv[1] == "show" else "", "")

    return run


def test_the_job_is_requeued_once_its_batch_host_is_lost(capsys):
    calls = []
    assert requeue_if_batch_host_lost({"SLURM_JOB_ID": "3"}, "rank 2 on n2", answering(LOST, calls)) == "n1"
    assert calls == [["show", "job", "-o", "3"], ["requeue", "3"]]
    assert "the batch host n1 left job 3" in capsys.readouterr().out


def test_nothing_is_requeued_while_the_batch_host_is_held():
    calls = []
    held = LOST.replace("NodeList=n[2-3]", "NodeList=n[1-3]")
    assert requeue_if_batch_host_lost({"SLURM_JOB_ID": "3"}, "rank 2 on n2", answering(held, calls)) is None
    assert calls == [["show", "job", "-o", "3"]]
    assert requeue_if_batch_host_lost({}, "rank 2 on n2", answering(LOST, calls)) is None and len(calls) == 1


def test_the_watch_requeues_a_job_that_runs_on_without_its_batch_host():
    """Slurm 24.11 keeps the job running once its batch host left it: no SIGTERM comes, the watch's look finds it."""
    calls, waits, answers = [], [], iter([LOST.replace("NodeList=n[2-3]", "NodeList=n[1-3]")] * 2 + [LOST])

    def run(argv, timeout_s):
        calls.append(argv[1:])
        return ToolResult(0, next(answers) if argv[1] == "show" else "", "")

    assert watch({"SLURM_JOB_ID": "3"}, "the watch on n2", lambda s: waits.append(s) or False, run) == "n1"
    assert waits == [POLL_S] * 3 and calls == [["show", "job", "-o", "3"]] * 3 + [["requeue", "3"]]


def test_the_watch_looks_once_more_at_sigterm():
    calls = []
    assert watch({"SLURM_JOB_ID": "3"}, "the watch on n2", lambda s: True, answering(LOST, calls)) == "n1"
    assert calls == [["show", "job", "-o", "3"], ["requeue", "3"]]
    calls.clear()
    held = LOST.replace("NodeList=n[2-3]", "NodeList=n[1-3]")
    assert watch({"SLURM_JOB_ID": "3"}, "the watch on n2", lambda s: True, answering(held, calls)) is None
    assert calls == [["show", "job", "-o", "3"]]
