"""The profile's container section: what each runtime renders, which section wins, bad input as one line."""

import shlex
from pathlib import Path

import pytest
import yaml
from login_helpers import WORKDIR, profile, spec_for

from hpc.render import launch_argv, render_sbatch, srun_args
from hpc.site import SiteError, load_site
from hpc.spec import PROJECT_ROOT, SpecError, build_spec


def load_error(path: Path) -> str:
    with pytest.raises(SiteError) as e:
        load_site(str(path))
    return str(e.value)


@pytest.mark.parametrize(
    "container,message",
    [
        (
            {"runtime": "docker", "image": "x"},
            "container.runtime: Input should be 'pyxis', 'apptainer', 'singularity' or 'command'",
        ),
        (
            {"runtime": "apptainer", "image": "/no/such/image.sif"},
            "container: image /no/such/image.sif does not exist (a local .sif file, or a URI such as docker://...)",
        ),
        ({"runtime": "singularity", "image": "relative.sif"}, "container: image relative.sif does not exist"),
        (
            {"runtime": "pyxis", "image": "x.sqsh", "mounts": ["/data"]},
            "container.mounts: mount '/data' is not SRC:DST or SRC:DST:ro with absolute paths (no commas)",
        ),
        (
            {"runtime": "pyxis", "image": "x.sqsh", "mounts": ["/a:/b:rw"]},
            "mount '/a:/b:rw' is not SRC:DST or SRC:DST:ro",
        ),
        ({"runtime": "pyxis", "image": "x.sqsh", "mounts": ["data:/data"]}, "mount 'data:/data' is not SRC:DST"),
        ({"runtime": "pyxis", "image": "x.sqsh", "mounts": ["/a,/b:/c"]}, "mount '/a,/b:/c' is not SRC:DST"),
        ({"runtime": "pyxis"}, "container: runtime pyxis needs image"),
        ({"runtime": "command"}, "container: runtime command needs command: the prefix as a list"),
        (
            {"runtime": "command", "command": ["run", "{img}"]},
            "container.command: command item '{img}': unknown placeholder {img}",
        ),
        (
            {"runtime": "command", "command": ["run", "{image}"]},
            "container: command uses {image} but image is not given",
        ),
        ({"runtime": "apptainer", "image": "docker://x", "command": ["x"]}, "command is the prefix of runtime command"),
    ],
)
def test_bad_container_sections_are_one_line_naming_file_and_key(tmp_path, container, message):
    path = profile(tmp_path, container)
    assert load_error(path).startswith(f"{path}: ") and message in load_error(path)


def test_a_bad_partition_section_is_named_too(tmp_path):
    path = profile(tmp_path, partition_container={"runtime": "apptainer", "image": "/gone.sif"})
    assert (
        load_error(path)
        == f"{path}: partitions.1.container: image /gone.sif does not exist (a local .sif file, or a URI such as docker://...)"
    )


def test_the_old_environment_container_says_where_it_moved(tmp_path):
    path = profile(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["environment"]["container"] = {"image": "x.sqsh"}
    path.write_text(yaml.safe_dump(data))
    assert load_error(path) == (
        f"{path}: environment.container: moved: write a top-level container: section with runtime: pyxis, image "
        "and mounts"
    )


def test_pyxis_renders_srun_options_and_launch_runs_inside(tmp_path, monkeypatch):
    monkeypatch.setenv("USER", "alice")
    spec = spec_for(profile(tmp_path, {"runtime": "pyxis", "image": "/img/pt.sqsh", "mounts": ["/data:/data:ro"]}))
    jobs, ckpt = WORKDIR / "jobs" / "train", WORKDIR / "checkpoints" / "train"
    assert srun_args(spec)[4:] == [  # after kill-on-bad-exit, ntasks- and cpus-per-task, output
        "--container-image=/img/pt.sqsh",
        f"--container-mounts={WORKDIR}:{WORKDIR},{jobs}:{jobs},{ckpt}:{ckpt},{PROJECT_ROOT}:{PROJECT_ROOT},/data:/data:ro",
        f"--container-workdir={WORKDIR}",
        "--no-container-mount-home",
        "--container-env=PYTHONPATH",
        '--container-name=hpc-"$SLURM_JOB_ID"-"${SLURM_RESTART_COUNT:-0}"',
    ]  # one container per job and run
    assert launch_argv(spec) == [
        "python",
        "-u",
        "-m",
        "hpc.node.launch",
        "--launcher",
        "srun",
        "--",
        "python",
        "-u",
        "-m",
        "hpc.node.smoke",
    ]
    assert f"export PYTHONPATH={PROJECT_ROOT}\n" in render_sbatch(spec)


@pytest.mark.parametrize("runtime", ["apptainer", "singularity"])
def test_apptainer_runs_behind_hpc_launch_on_the_host(tmp_path, monkeypatch, runtime):
    monkeypatch.setenv("USER", "alice")
    image = tmp_path / "pt.sif"
    image.write_bytes(b"")
    spec = spec_for(
        profile(tmp_path, {"runtime": runtime, "image": str(image), "project": "installed", "python": "python3"})
    )
    argv = launch_argv(spec)
    assert argv[:8] == [
        "/opt/venv/bin/python",
        "-u",
        "-m",
        "hpc.node.launch",
        "--launcher",
        "srun",
        "--container",
        argv[7],
    ]
    jobs, ckpt = WORKDIR / "jobs" / "train", WORKDIR / "checkpoints" / "train"
    assert shlex.split(argv[7]) == [
        runtime,
        "exec",
        "--nv",
        "--pwd",
        str(WORKDIR),
        "--bind",
        f"{WORKDIR}:{WORKDIR}",
        "--bind",
        f"{jobs}:{jobs}",
        "--bind",
        f"{ckpt}:{ckpt}",
        str(image),
    ]
    assert argv[8:] == ["--", "python3", "-u", "-m", "hpc.node.smoke"]
    assert srun_args(spec) == srun_args(spec_for(profile(tmp_path, name="plain")))
    assert "PYTHONPATH" not in render_sbatch(spec)  # installed in the image: nothing mounted, nothing set


def test_partition_section_wins_and_container_flag_overrides_the_image(tmp_path, monkeypatch):
    monkeypatch.setenv("USER", "alice")
    path = profile(
        tmp_path,
        {"runtime": "pyxis", "image": "site.sqsh"},
        partition_container={"runtime": "apptainer", "image": "docker://part"},
    )
    assert spec_for(path).container.image == "site.sqsh"
    assert spec_for(path, partition="low").container.runtime == "apptainer"
    assert spec_for(path, partition="low", container_image="docker://other").container.image == "docker://other"
    assert "--container-image=mine.sqsh" in srun_args(spec_for(path, container_image="mine.sqsh"))
    with pytest.raises(SpecError, match=r"^--container /none.sif: image /none.sif does not exist"):
        spec_for(path, partition="low", container_image="/none.sif")


def test_directories_a_mount_cannot_carry_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("USER", "alice")
    site = load_site(str(profile(tmp_path, {"runtime": "pyxis", "image": "x.sqsh"})))
    with pytest.raises(
        SpecError, match=r"^container: the submit directory /home/alice/pro,ject has a comma, colon or newline"
    ):
        build_spec(site, nodes=1, workdir=Path("/home/alice/pro,ject"), python="python", args=["-m", "hpc.node.smoke"])
