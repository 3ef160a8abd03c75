"""The trainer's part of a job: built from the words after ``--``, rendered once into the ranks' command line, loaded
from exactly that line; the planner's layout as data; the torch-free tokenizer check against transformers' load."""

import shlex
from pathlib import Path

import pytest

from hpc.node.cli import HpcError
from hpc.render import render_sbatch
from hpc.site import load_site
from hpc.spec import build_spec, plan_trainer
from train.data.tokenizer import load_tokenizer
from train.front.config import load_config, split_cli
from train.front.interface import CONFIG_DIR
from train.front.layout import Layout
from train.front.tokenizer import DEMO_CHAT_TOKENIZER_DIR, DEMO_TOKENIZER_DIR, check_tokenizer

TINY = str(CONFIG_DIR / "tiny.yaml")


def spec(site: str, args, monkeypatch, **kw):
    monkeypatch.setenv("USER", "alice")
    return build_spec(load_site(site), nodes=2, workdir=Path("/home/alice/project"), python="python", args=args, **kw)


def launch_words(text: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.endswith(" || rc=$?")).removesuffix(" || rc=$?")
    words = shlex.split(line)
    return words[words.index("train") + 1 :]


def test_the_rendered_line_is_the_trainer_part_and_loads_as_checked(monkeypatch):
    s = spec("local", ["optim.lr=1e-3", "log.dir=/runs/mine"], monkeypatch)
    t = s.trainer
    assert t.config == str(CONFIG_DIR / "demo.yaml") and t.overrides == ("optim.lr=1e-3", "log.dir=/runs/mine")
    assert [k for k, _ in t.run_dirs] == ["checkpoint.dir"]  # the user set log.dir: the job sets only checkpoint.dir
    words = launch_words(render_sbatch(s))
    assert (
        words
        == t.args()
        == [
            "--config",
            t.config,
            "optim.lr=1e-3",
            "log.dir=/runs/mine",
            "checkpoint.dir=/home/alice/project/checkpoints/train",
        ]
    )
    config, overrides = split_cli(words)  # what the rank parses
    assert t.load() == load_config(config, overrides)
    assert t.load().log.dir == "/runs/mine" and t.load().optim.lr == 1e-3


def test_minus_m_hpc_train_is_the_trainer_and_a_module_is_not(monkeypatch):
    assert spec("local", ["-m", "train", "--config", TINY], monkeypatch).trainer.config == TINY
    other = spec("local", ["-m", "hpc.node.smoke", "--x"], monkeypatch)
    assert other.trainer is None and other.command == ("python", "-u", "-m", "hpc.node.smoke", "--x")
    with pytest.raises(HpcError, match="trainer: trainer argument '--lr'"):
        spec("local", ["--lr", "1"], monkeypatch)


def test_the_planner_layout_is_data_added_once(monkeypatch):
    s, cfg, note = plan_trainer(spec("ib-h200", ["--config", TINY, "global_batch=32"], monkeypatch))
    assert s.trainer.layout == Layout(tp=1) and note.startswith("planner: dp=16 x tp=1")
    assert launch_words(render_sbatch(s))[:4] == ["--config", TINY, "global_batch=32", "parallel.tp=1"]
    assert cfg == s.trainer.load()  # the config the check gets is the one the ranks load
    given, cfg, note = plan_trainer(spec("ib-h200", ["--config", TINY, "parallel.tp=2"], monkeypatch))
    assert given.trainer.layout is None and note is None and cfg.parallel.tp == 2


@pytest.mark.parametrize(
    "site, args, planned",
    [
        ("ib-h200", ["global_batch=32"], (1, 1, False)),  # dense: the smallest tp, no checkpointing needed
        (
            "ib-h200",
            ["model.shape=tiny-moe", "global_batch=32"],
            (1, 8, False),
        ),  # 8 experts over a node's 8 GPUs (dp 16)
        ("roce-h100", ["model.shape=32B", "seq_len=4096", "micro_batch=1", "global_batch=16"], (1, 1, True)),
        (
            "roce-h100",
            ["model.shape=30B-A3B", "seq_len=4096", "micro_batch=1", "global_batch=16"],
            (1, 8, True),
        ),  # 128 experts
    ],
)
def test_the_ranks_load_the_planned_layout_and_the_check_gets_their_config(site, args, planned, monkeypatch):
    """Dense and mixture-of-experts plans on 2 nodes x 8 GPUs: the config every rank loads from its command line carries
    the planner's tp, ep and activation checkpointing, and is the config the submit checked."""
    s, cfg, note = plan_trainer(spec(site, ["--config", TINY, *args], monkeypatch))
    config, overrides = split_cli(launch_words(render_sbatch(s)))
    loaded = load_config(config, overrides)
    assert (loaded.parallel.tp, loaded.parallel.ep, loaded.activation_checkpointing) == planned
    assert (s.trainer.layout.tp, s.trainer.layout.ep, s.trainer.layout.activation_checkpointing) == planned
    assert cfg == loaded and note.startswith(f"planner: dp=16 x tp={planned[0]}")


@pytest.mark.parametrize("directory", [DEMO_TOKENIZER_DIR, DEMO_CHAT_TOKENIZER_DIR])
def test_tokenizer_check_counts_what_transformers_loads(directory):
    assert check_tokenizer(str(directory)) == len(load_tokenizer(str(directory)))


def test_tokenizer_check_refuses_broken_files(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0"}')
    with pytest.raises(HpcError, match=f"tokenizer: {tmp_path} cannot be loaded"):
        check_tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(HpcError, match="not a JSON object"):
        check_tokenizer(str(tmp_path))
