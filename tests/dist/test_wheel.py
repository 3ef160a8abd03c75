"""The built wheel, installed outside the checkout, runs from any directory: templates and shipped profiles are
package data, the console scripts exist, users' profiles are found on the search path, and its dry run is the
checkout's."""

import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import PYTHON, ROOT, run_cli
from wheel_helpers import build_wheel, install_wheel, installed_env

SCRIPTS = ("hpc-submit", "hpc-jobs", "hpc-preflight", "hpc-plan", "hpc-train", "hpc-prepare", "hpc-generate")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    bin_dir = install_wheel(build_wheel(base), base / "venv")
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import hpc, train; print(hpc.__file__); print(train.__file__)"],
        cwd=base,
        env=installed_env(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    package_root = Path(where[0]).parent.parent
    assert package_root.is_relative_to(base / "venv") and Path(where[1]).parent.parent == package_root, where
    return bin_dir, package_root


def run_installed(bin_dir: Path, *argv: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin_dir / argv[0]), *argv[1:]],
        cwd=cwd,
        env=installed_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_console_scripts_are_installed(installed):
    bin_dir, _ = installed
    assert all((bin_dir / name).is_file() for name in SCRIPTS), sorted(p.name for p in bin_dir.iterdir())
    r = run_installed(bin_dir, "hpc-jobs", "--help", cwd=bin_dir)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr


def test_installed_dry_run_is_the_checkouts(installed, tmp_path):
    """`hpc-submit` and `python -m hpc.submit` of the installed package, from a directory of their own, print the
    checkout's script: the same text but for the interpreter and where the package lives."""
    bin_dir, package_root = installed
    argv = ("--site", "local", "--nodes", "1", "--dry-run")
    in_tree = run_cli("-m", "hpc.submit", *argv, cwd=tmp_path)
    assert in_tree.returncode == 0, in_tree.stderr
    for command in (("hpc-submit",), ("python", "-m", "hpc.submit")):
        r = run_installed(bin_dir, *command, *argv, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert str(package_root / "train" / "configs" / "demo.yaml") in r.stdout
        text = r.stdout.replace(str(bin_dir / "python"), PYTHON).replace(str(package_root), str(ROOT))
        assert text == in_tree.stdout
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


def test_users_profiles_on_the_search_path(installed, tmp_path):
    bin_dir, _ = installed
    profile = yaml.safe_load((ROOT / "site_configs" / "ib-h200.yaml").read_text())
    work, xdg = tmp_path / "work", tmp_path / "xdg" / "hpc" / "sites"
    for d, name in ((work, "here"), (xdg, "mine")):
        d.mkdir(parents=True)
        (d / f"{name}.yaml").write_text(yaml.safe_dump({**profile, "name": name}))
    for site in ("here", "mine", str(xdg / "mine.yaml")):
        r = run_installed(
            bin_dir,
            "hpc-plan",
            "--site",
            site,
            "--nodes",
            "2",
            "--model",
            "8B",
            cwd=work,
            XDG_CONFIG_HOME=str(tmp_path / "xdg"),
        )
        assert r.returncode == 0 and f"on site {Path(site).stem}, partition gpu: 2 node(s) x 8 GPU(s)" in r.stdout, (
            r.stderr
        )
    r = run_installed(bin_dir, "hpc-submit", "--site", "nosuch", "--nodes", "1", "--dry-run", cwd=work)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "site 'nosuch' not found" in r.stderr and "here, ib-h200, local" in r.stderr
