"""The design's top-level folders of shipped files: ``sbatch_templates/`` and ``site_configs/``. A checkout and an
editable install hold them beside ``hpc/``; a wheel carries them as package data inside ``hpc/`` (pyproject.toml's
package-dir mapping), so every install finds them the same way."""

from pathlib import Path

_HPC = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """The folder NAME inside the installed package if it is there, else beside the package (a checkout)."""
    inside = _HPC / name
    return inside if inside.is_dir() else _HPC.parent / name


TEMPLATE_DIR = shipped_dir("sbatch_templates")
SHIPPED_SITE_DIR = shipped_dir("site_configs")
