"""Rank wiring from SLURM_* variables (pure functions; the real cluster proves it in test_cluster.py)."""

import pytest

from hpc.node.launcher import LAUNCHERS
from hpc.node.slurm_env import PORT_BASE, PORT_SPAN, RankError, derive, expand_tasks_per_node, master_port, node_hosts


def task_env(procid, localid, nodeid, ntasks=8, nnodes=2, tpn="4(x2)", gpus="4", nodelist="gpu-a[001,010]"):
    env = {
        "SLURM_JOB_ID": "123456",
        "SLURM_PROCID": str(procid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_JOB_NUM_NODES": str(nnodes),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": tpn,
    }
    if gpus is not None:
        env["SLURM_GPUS_ON_NODE"] = gpus
    return env


def test_hosts_of_compressed_hostlist():
    assert node_hosts("gpu-a[001-003,010],gpu-b7") == ["gpu-a001", "gpu-a002", "gpu-a003", "gpu-a010", "gpu-b7"]
    assert node_hosts("gpu-b7,gpu-a[001-003]")[0] == "gpu-b7"
    assert node_hosts("n[10-12]") == ["n10", "n11", "n12"]
    with pytest.raises(RankError, match="not a valid hostlist"):
        node_hosts("n[3-1")


def test_tasks_per_node_expansion():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("8") == [8]
    with pytest.raises(RankError, match="Slurm's form"):
        expand_tasks_per_node("2x3")


def test_srun_one_task_per_gpu():
    info = derive(task_env(procid=5, localid=1, nodeid=1))
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (5, 8, 1, 4)
    assert (info.node_rank, info.num_nodes, info.master_addr) == (1, 2, "gpu-a001")
    env = info.torch_env()
    assert env["RANK"] == "5" and env["WORLD_SIZE"] == "8" and env["MASTER_ADDR"] == "gpu-a001"
    assert env["MASTER_PORT"] == str(master_port(123456))


def test_port_is_deterministic_per_job_and_outside_ephemeral_range():
    ports = {derive(task_env(p, p % 4, p // 4)).master_port for p in range(8)}
    assert len(ports) == 1
    for job in (0, 1, 99999, 2**31 - 1):
        for restart in (0, 1, 7):
            assert PORT_BASE <= master_port(job, restart) < PORT_BASE + PORT_SPAN < 32768
    assert master_port(10) != master_port(11)
    assert master_port(10, 0) != master_port(10, 1)


def test_tasks_not_matching_gpus_says_what_to_change():
    with pytest.raises(RankError, match=r"2 tasks per node but 4 GPUs per node: use --ntasks-per-node=4"):
        derive(task_env(0, 0, 0, ntasks=4, tpn="2(x2)"))


def test_uneven_tasks_per_node():
    with pytest.raises(RankError, match=r"tasks per node differ across nodes \(4,3\)"):
        derive(task_env(0, 0, 0, ntasks=7, tpn="4,3", gpus=None))


def test_missing_variables_name_them():
    env = task_env(0, 0, 0)
    del env["SLURM_PROCID"], env["SLURM_LOCALID"]
    with pytest.raises(RankError, match="missing SLURM_PROCID, SLURM_LOCALID: run this inside a Slurm job step"):
        derive(env)


def test_step_variables_win_over_job_variables():
    env = task_env(0, 0, 0, ntasks=8)
    env.update(
        SLURM_STEP_NODELIST="gpu-b7", SLURM_STEP_NUM_TASKS="4", SLURM_STEP_NUM_NODES="1", SLURM_STEP_TASKS_PER_NODE="4"
    )
    info = derive(env)
    assert (info.world_size, info.num_nodes, info.master_addr) == (4, 1, "gpu-b7")


# every process of torchrun / accelerate runs the rank command through hpc.node.launch --rank
RANK_WRAP = [
    "/venv/bin/python",
    "-u",
    "-m",
    "hpc.node.launch",
    "--rank",
    "--",
    "/venv/bin/python",
    "-u",
    "train.py",
    "--lr",
    "1",
]


def test_torchrun_one_task_per_node():
    env = task_env(1, 0, 1, ntasks=2, tpn="1(x2)", gpus="4")
    info = derive(env, LAUNCHERS["torchrun"])
    assert (info.node_rank, info.num_nodes, info.local_world_size, info.world_size) == (1, 2, 4, 8)
    argv = LAUNCHERS["torchrun"].node_argv(["/venv/bin/python", "-u", "train.py", "--lr", "1"], info)
    assert argv == [
        "/venv/bin/python",
        "-u",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=4",
        "--node-rank=1",
        "--master-addr=gpu-a001",
        f"--master-port={info.master_port}",
        "--no-python",
        *RANK_WRAP,
    ]


def test_torchrun_refuses_several_tasks_per_node():
    with pytest.raises(RankError, match="one task per node, got 8 tasks on 2 nodes"):
        derive(task_env(0, 0, 0), LAUNCHERS["torchrun"])


def test_restart_count_changes_port_consistently():
    env = task_env(0, 0, 0)
    env["SLURM_RESTART_COUNT"] = "2"
    info = derive(env)
    assert info.restart_count == 2 and info.master_port == master_port(123456, 2)


@pytest.mark.parametrize("cuda,prefix", [(True, []), (False, ["env", "ACCELERATE_USE_CPU=true"])])
def test_accelerate_one_task_per_node(cuda, prefix):
    info = derive(task_env(1, 0, 1, ntasks=2, tpn="1(x2)", gpus="4"), LAUNCHERS["accelerate"])
    argv = LAUNCHERS["accelerate"].node_argv(["/venv/bin/python", "-u", "train.py", "--lr", "1"], info, cuda=cuda)
    assert argv == [
        *prefix,
        "/venv/bin/python",
        "-u",
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_machines=2",
        "--num_processes=8",
        "--machine_rank=1",
        "--main_process_ip=gpu-a001",
        f"--main_process_port={info.master_port}",
        "--no_python",
        *RANK_WRAP,
    ]


def test_accelerate_single_rank_is_not_multi_gpu():
    info = derive(task_env(0, 0, 0, ntasks=1, nnodes=1, tpn="1", gpus="1", nodelist="n1"), LAUNCHERS["accelerate"])
    argv = LAUNCHERS["accelerate"].node_argv(["python", "-u", "-m", "pkg.mod"], info, cuda=True)
    assert "--multi_gpu" not in argv and argv[-2:] == ["-m", "pkg.mod"] and "--num_processes=1" in argv


def test_accelerate_refuses_several_tasks_per_node():
    with pytest.raises(RankError, match="launcher accelerate needs one task per node, got 8 tasks on 2 nodes"):
        derive(task_env(0, 0, 0), LAUNCHERS["accelerate"])
