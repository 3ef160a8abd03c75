"""The training run: set up (data, model, parallelism, optimizer, resume), then the step loop.

``Trainer.run`` checks ``stop_requested`` after every step; when it returns True the trainer
saves a checkpoint and returns, so a preemption handler only has to set a flag.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel

from hpc.node.attempt import Progress
from hpc.node.cli import HpcError
from hpc.node.contract import EXIT_FAILED, RUN_CONFIG, checkpoint_step
from hpc.node.fault_table import classify
from hpc.node.hang import collective_failure, gather_nodes, mark_bad_nodes, name_the_missing
from hpc.node.heartbeat import EVAL, FIRST_STEP, SAVE, STEP, Heartbeat
from hpc.node.snapshot_dir import job_dir
from train import adapters, checkpoint, faults, resume, snapshot
from train.context_parallel import SequenceShards
from train.data.prepared import open_prepared, split_rows
from train.data.stream import PackedStream, TokenStream, eval_batches
from train.data.text import load_tokens_on_rank0
from train.data.tokenizer import load_tokenizer
from train.float8 import precompute_weight_scales
from train.front.config import ConfigError, TrainConfig
from train.front.layout import CP, DP
from train.front.tokenizer import tokenizer_source
from train.loss import IGNORE
from train.metrics import MetricsLog, flops_per_token, peak_flops, peak_memory_gib
from train.model import build_meta_model, count_params, export_hf, hf_config, is_moe, load_initial_weights, materialize
from train.moe import load_imbalance, routing_summary
from train.packed_attention import check_packed_attention
from train.parallel import ParallelDims, WorldEnv, build_mesh, clip_grad_norm_, fsdp_mesh, parallelize
from train.precision import MasterWeights
from train.step_guard import StepFailed, StepGuard
from train.steptime import timed_step
from train.straggler import StragglerMonitor, describe
from train.tracking import Tracking


def lr_at(step: int, lr: float, warmup_steps: int, min_lr: float, total_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (1-based): linear warmup to ``lr``, then cosine to ``min_lr`` at
    ``total_steps``."""
    if step <= warmup_steps:
        return lr * step / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


# The attention kernels tried first for sdpa_backend (PyTorch falls back along the list).
_SDPA_ORDER = {
    "cudnn": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "flash": [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
}


# Python's automatic garbage collection is off while training, so that no collection among
# the compiled graphs' many objects stalls the host in the middle of a step; the young
# generations are collected every GC_EVERY_STEPS steps instead (as torchtitan does).
GC_EVERY_STEPS = 50


def _log0(msg: str) -> None:
    if dist.get_rank() == 0:
        print(msg, flush=True)


class CollectiveTimedOut(HpcError):
    """A collective timed out: the ``[hang]`` line named who did not arrive; the run fails (exit 1)."""

    code = EXIT_FAILED


class Trainer:
    """One training run on this rank; the process group must already be initialized.

    On GPU the loss comes from the fused linear cross-entropy (no logits), AdamW is fused,
    and the step loop waits for the device only every ``log.log_every`` steps (metrics); on
    CPU every step is read. The stop check after every step waits for no device.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        dims: ParallelDims,
        env: WorldEnv,
        device: torch.device,
        run_id: str,
        job_id: str | None = None,
    ):
        self.cfg, self.dims, self.device, self.run_id = cfg, dims, device, run_id
        self.rank = env.rank
        self.run_dir = Path(cfg.log.dir)
        self.mesh = build_mesh(dims, device)
        self.split = dims.batch_split(cfg.global_batch, cfg.micro_batch)
        # the ranks that share the step's loss: dp, or dp x cp (each cp rank holds a slice of every row)
        self.batch_group = fsdp_mesh(self.mesh).get_group()
        self.shards = (
            SequenceShards(cfg.seq_len, dims.cp, self.mesh[CP].get_local_rank(), self.mesh[CP].get_group())
            if dims.cp_enabled
            else None
        )
        experts = f" (experts split over ep={dims.ep} of the dp ranks)" if dims.ep_enabled else ""
        context = (
            f" x cp={dims.cp} ({self.shards.num_chunks} chunks of {self.shards.chunk_len} tokens per row)"
            if self.shards
            else ""
        )
        _log0(
            f"[train] layout dp={dims.dp}{context} x tp={dims.tp}{experts} on {env.world_size} ranks, mesh "
            f"({', '.join(self.mesh.mesh_dim_names)}) {self.mesh.mesh.tolist()}; "
            f"{self.split.describe()}; device {device.type}"
        )
        if self.split.uneven_note():
            _log0(f"[train] {self.split.uneven_note()}")
        self.eval_batches: list[tuple[torch.Tensor, ...]] = []
        self.on_gpu = device.type == "cuda"
        self.tokenizer_name = tokenizer_source(cfg.data.tokenizer, cfg.model.path, cfg.data.format == "chat")
        self.tokenizer = load_tokenizer(self.tokenizer_name)
        self.hf_config = hf_config(cfg.model, self.tokenizer)
        self.lora_meta = adapters.lora_meta(
            cfg.lora, adapters.base_identity(cfg.model.path, cfg.model.shape, cfg.model.dims_dict(), cfg.seed)
        )
        self.written_with = resume.written_with(cfg, self.hf_config, self.lora_meta)
        self._check_checkpoints()
        self._setup_data()
        self._setup_model(env.world_size)
        o = cfg.optim
        impl = {"fused": True} if self.on_gpu else {"foreach": False}
        self.trainable = [p for p in self.master.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.trainable, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, **impl
        )
        self.sync_every = cfg.log.log_every if self.on_gpu else 1
        self.step = 0
        self.guard = StepGuard(device)
        self.pending: checkpoint.PendingSave | None = None
        background = cfg.checkpoint.async_save
        self._stager = checkpoint.host_stager(pinned=self.on_gpu) if background else None
        self._write_group = (
            dist.new_group(backend="gloo") if background else None
        )  # the writer thread's own collectives
        self._prepare_checkpoints(job_id)
        self.progress = Progress(self.rank)  # a job with spare nodes: the load and the steps, for hpc.node.restart
        self.faults = faults.planned(self.rank)  # tests only (HPC_TEST_FAULTS)
        self.nodes = gather_nodes()  # each rank's node, by rank: snapshots' partners, stragglers, the missing at a hang
        every = cfg.checkpoint.memory_every
        self.snapshots = snapshot.Snapshots(every, job_dir(os.environ), self.nodes, self.on_gpu) if every else None
        self._resume()
        self.straggler = StragglerMonitor(cfg.straggler, self.rank, device, cfg.log.log_every, self.nodes)
        self.resumed_at = self.step
        self.stopped_for: str | None = None  # why the run stopped before cfg.steps other than a stop signal
        gc.collect()
        gc.disable()
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / RUN_CONFIG).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        self.tracking = Tracking(cfg, self._tracker_ids, self.step) if self.rank == 0 and cfg.log.tracker else None
        self.metrics = MetricsLog(
            self.run_dir,
            self.rank == 0,
            cfg.log.log_every,
            cfg.steps,
            tokens_per_step=cfg.global_batch * cfg.seq_len,
            flops_per_token=self.flops_per_token,
            peak_flops_total=self.peak_flops_total,
            resume_step=self.step,
            sync_every=self.sync_every,
            tracking=self.tracking,
        )

    def _setup_data(self) -> None:
        """The stream, tokenized with ``self.tokenizer``: rows of the prepared data (packed by document; prepared here
        over all ranks if missing), or blocks of the token cache (rank 0 fills it, the others poll for it). Neither
        waits at a collective while data is being prepared."""
        cfg, name = self.cfg, self.tokenizer_name
        dp_rank = self.mesh[DP].get_local_rank()
        if cfg.data.packed:
            check_packed_attention(cfg.model.attn_implementation)
            how = "python -m train.prepare --config FILE with the training run's overrides"
            world = dist.get_world_size()
            data = open_prepared(
                cfg.data, cfg.seq_len, self.tokenizer, name, cfg.prepared_dir, self.rank, world, how, _log0
            )
            train_ids, held = split_rows(data.num_rows, cfg.eval.fraction)
            self.stream = PackedStream(
                data, train_ids, cfg.global_batch, cfg.micro_batch, dp_rank, self.dims.dp, cfg.seed
            )
            _log0(
                f"[train] data: {self.stream.num_blocks:,} packed rows of {cfg.seq_len}, {self.stream.steps_per_epoch} "
                "steps per epoch"
            )
            if cfg.eval.path is not None:
                eval_cfg = cfg.data.model_copy(update={"path": cfg.eval.path})
                data = open_prepared(
                    eval_cfg, cfg.seq_len, self.tokenizer, name, cfg.prepared_dir / "eval", self.rank, world, how, _log0
                )
                held = np.arange(data.num_rows)
            if cfg.eval.every:
                self.eval_batches = eval_batches(
                    data, held, cfg.eval.batches * cfg.global_batch, cfg.micro_batch, dp_rank, self.dims.dp
                )
                _log0(
                    f"[train] eval: {sum(len(b[0]) for b in self.eval_batches) * self.dims.dp:,} held-out rows every "
                    f"{cfg.eval.every} steps"
                )
            return
        tokens = load_tokens_on_rank0(cfg.data, self.tokenizer, str(self.run_dir / "cache"), self.rank)
        self.stream = TokenStream(
            tokens, cfg.seq_len, cfg.global_batch, cfg.micro_batch, dp_rank, self.dims.dp, cfg.seed
        )
        _log0(
            f"[train] data: {tokens.numel():,} tokens, {self.stream.num_blocks:,} blocks of {cfg.seq_len + 1}, "
            f"{self.stream.steps_per_epoch} steps per epoch"
        )

    def _setup_model(self, world_size: int) -> None:
        """Meta-device Qwen3 -> parallelize (TP, AC, compile, FSDP2) -> materialize with the initial weights.

        ``self.model`` computes; ``self.master`` holds the weights that the optimizer updates and
        checkpoints save: the same module, except on one rank with bf16 compute and fp32 master
        weights (no FSDP to cast), where it is an fp32 twin kept by ``MasterWeights``."""
        cfg, device = self.cfg, self.device
        c = self.hf_config
        self.moe = is_moe(c)
        params = count_params(c)
        self.flops_per_token = flops_per_token(
            params, c.num_hidden_layers, c.num_attention_heads, c.head_dim, cfg.seq_len
        )
        peak = peak_flops(device)
        self.peak_flops_total = None if peak is None else peak * world_size
        source = f"shape {cfg.model.shape}" if cfg.model.shape else f"from {cfg.model.path}"
        experts = (
            f", {c.num_experts} experts top-{c.num_experts_per_tok} ({params['active_non_embedding']:,} non-embedding "
            "active per token)"
            if self.moe
            else ""
        )
        _log0(
            f"[train] model Qwen3 {source}: {params['total']:,} params ({params['non_embedding']:,} non-embedding), "
            f"hidden {c.hidden_size}, {c.num_hidden_layers} layers, {c.num_attention_heads} heads / "
            f"{c.num_key_value_heads} kv, vocab {c.vocab_size}{experts}"
        )
        compute_dtype = (
            torch.bfloat16 if cfg.dtype == "bf16" or (cfg.dtype == "auto" and self.on_gpu) else torch.float32
        )
        master_dtype = torch.bfloat16 if cfg.master_dtype == "bf16" else torch.float32
        one_rank = (
            self.mesh.size() == 1
        )  # no FSDP: the model computes in compute_dtype, ``self.master`` holds the weights
        lora = cfg.lora.enabled  # a frozen base in compute_dtype, adapters in master_dtype: no twin
        twin = one_rank and master_dtype != compute_dtype and not lora
        self.model = parallelize(
            build_meta_model(c).to(compute_dtype if one_rank or lora else master_dtype),
            self.mesh,
            activation_checkpointing=cfg.activation_checkpointing,
            compile=cfg.compile,
            param_dtype=compute_dtype,
            fp8_recipe=cfg.fp8.recipe if cfg.fp8.enabled else None,
            lora=cfg.lora,
            adapter_dtype=master_dtype,
            offload_to=device if cfg.activation_offload else None,
            shards=self.shards,
            tiled_mlp=cfg.tiled_mlp,
        )
        self.master = build_meta_model(c).to(master_dtype) if twin else self.model
        load_initial_weights(self.master, cfg.model, c, cfg.seed, device, nf4=lora and cfg.lora.quantize_base == "nf4")
        if lora:
            trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            # the frozen base gets no weight gradients: 4 FLOPs per weight and token instead of 6; the adapters 6
            self.flops_per_token += 6 * trained - 2 * (params["non_embedding"] + params["lm_head"])
            _log0(
                f"[train] LoRA r={cfg.lora.r} alpha={cfg.lora.alpha} on {', '.join(cfg.lora.target_modules)}: "
                f"{trained:,} trainable "
                f"parameters (all ranks), base frozen" + (" in NF4" if cfg.lora.quantize_base == "nf4" else "")
            )
        self.master_weights = None
        if twin:
            materialize(self.model, c, device)
            self.master_weights = MasterWeights(self.model, self.master)
            self.master_weights.copy_to_model()
        self.model.train()

    def _check_checkpoints(self) -> None:
        """Before anything is read or written (collective): refuse, on every rank, checkpoints written with other
        settings (with checkpoint.restart=fresh they are moved aside later, by ``_prepare_checkpoints``)."""
        cfg, root = self.cfg, self.cfg.checkpoint_dir
        outcome: list = [None]
        if self.rank == 0 and cfg.checkpoint.restart != "fresh":
            try:
                outcome[0] = resume.mismatch(
                    [p for _, p in checkpoint.committed_checkpoints(root)][::-1], self.written_with
                )
            except OSError as e:
                outcome[0] = f"checkpoint.dir {root}: cannot read it ({e.strerror}: {e.filename})"
        dist.broadcast_object_list(outcome, src=0)
        if outcome[0]:
            raise ConfigError(outcome[0])

    def _prepare_checkpoints(self, job_id: str | None) -> None:
        """Once the data and the model are set up, so that no later refusal finds them moved (collective): with
        checkpoint.restart=fresh move the old run's files aside; half-written checkpoints of runs that ended (this run
        holds the directory's lease) are removed."""
        cfg, root = self.cfg, self.cfg.checkpoint_dir
        outcome: list = [None, []]  # [refusal, log lines]
        if self.rank == 0:
            try:
                if cfg.checkpoint.restart == "fresh":
                    moved = resume.start_fresh(root, Path(cfg.log.dir), job_id)
                    outcome[1].append(
                        f"checkpoint.restart=fresh: moved {moved}"
                        if moved
                        else "checkpoint.restart=fresh: nothing to move aside"
                    )
                for tmp in checkpoint.tmp_dirs(root):
                    shutil.rmtree(tmp)
                    outcome[1].append(f"removed {tmp.name}, left half-written by a run that ended")
            except OSError as e:
                outcome[0] = f"checkpoint.dir {root}: cannot prepare it ({e.strerror}: {e.filename})"
        dist.broadcast_object_list(outcome, src=0)
        for line in outcome[1]:
            _log0(f"[train] {line}")
        if outcome[0]:
            raise ConfigError(outcome[0])

    def _export_lora(self, target: Path) -> None:
        """The PEFT adapter directory (and the tokenizer) in ``target``; with lora.merge the merged model in
        target/merged."""
        base = self.cfg.model.path or "Qwen3 shape " + str(self.cfg.model.shape)
        adapters.export_adapter(self.model, self.cfg.lora, base, target)
        if self.rank == 0:
            self.tokenizer.save_pretrained(target)
        _log0(f"[train] exported the PEFT adapter to {target}")
        if self.cfg.lora.merge:
            export_hf(
                self.model,
                self.hf_config,
                self.tokenizer,
                str(target / "merged"),
                to_hf=lambda s: adapters.merged_state(s, self.cfg.lora),
            )
            _log0(f"[train] exported the merged Hugging Face model to {target / 'merged'}")

    def _resume(self) -> None:
        """Load the newest checkpoint that is whole; a damaged one (files not matching its manifest) is set aside and
        the next older one tried. Any other failure of a load fails the start (exit 1) with nothing set aside."""
        self._tracker_ids: dict[str, str] = {}  # the tracker runs this training run logs to (rank 0's checkpoint meta)
        root = self.cfg.checkpoint_dir
        found = [str(path) for _, path in checkpoint.committed_checkpoints(root)]
        candidates = [found[::-1]]
        dist.broadcast_object_list(candidates, src=0)
        self.progress.loading()
        t0 = time.perf_counter()
        if self.snapshots is not None and self._resume_from_snapshot(candidates[0], t0):
            return
        for path in candidates[0]:
            try:
                meta = self.load(Path(path))
            except checkpoint.CheckpointDamaged as e:
                if self.rank == 0:
                    moved = checkpoint.set_aside(Path(path), str(e))
                    print(f"[train] {e}; set aside as {moved}", flush=True)
                dist.barrier()
                continue
            self.stream.load_state_dict(meta["data"])
            self.step = meta["step"]
            self._tracker_ids = meta.get("tracker", {})
            self.progress.loaded(self.step)
            cp = meta.get("cp", 1)  # written since context parallelism
            _log0(
                f"[train] resumed from {path} (step {self.step}, saved under dp={meta['dp']}"
                f"{f' x cp={cp}' if cp > 1 else ''} x tp={meta['tp']}), "
                f"loaded in {time.perf_counter() - t0:.2f} s"
            )
            if meta.get("grad_accum", self.split.accum) != self.split.accum:
                _log0(
                    f"[train] the same global_batch {self.split.global_batch}: grad accumulation {self.split.accum} at "
                    f"dp={self.dims.dp} (it was {meta['grad_accum']} at dp={meta['dp']})"
                )
            return
        aside = [[p.name for p in checkpoint.set_aside_checkpoints(root)]]
        dist.broadcast_object_list(aside, src=0)
        if aside[0]:
            raise ConfigError(
                f"checkpoint.dir {root}: no checkpoint loads and {', '.join(aside[0])} were set aside as "
                "damaged (WHY.txt in each); set checkpoint.restart=fresh to train from step 0 (they are kept)"
            )
        self.progress.loaded(0)
        _log0(f"[train] no checkpoint in {root}: starting at step 0")

    def _resume_from_snapshot(self, disk: list[str], t0: float) -> bool:
        """Load the newest memory snapshot complete for every rank when it is newer than the newest disk checkpoint
        (``disk``, newest first; collective); False: resume from the disk."""
        disk_step = checkpoint_step(Path(disk[0]).name) if disk else None
        choice = self.snapshots.choice(disk_step)
        if choice is None:
            return False
        extra = self.snapshots.load(choice, self.master, self.optimizer)
        if extra is None:
            _log0(f"[train] the memory snapshot of step {choice.step} could not be read: resuming from the disk")
            return False
        if self.master_weights is not None:
            self.master_weights.copy_to_model()
        self.stream.load_state_dict(extra["data"])
        self.step = extra["step"]
        self._tracker_ids = extra.get("tracker", {})
        self.progress.loaded(self.step)
        sent = choice.transfers(self.nodes)
        how = (
            f"{len(sent)} rank(s)' state sent by the nodes holding their partner copy ("
            + ", ".join(f"rank {dst} from rank {src}" for src, dst in sent)
            + ")"
            if sent
            else "every rank's state on its own node"
        )
        _log0(
            f"[train] resumed from the memory snapshot of step {self.step} (newest disk checkpoint: "
            f"{'step ' + str(disk_step) if disk_step is not None else 'none'}; {how}), loaded in "
            f"{time.perf_counter() - t0:.2f} s"
        )
        return True

    def _snapshot(self) -> None:
        """This step's memory snapshot: the state copied to host memory now, written and sent in the background."""
        extra = {
            "data": self.stream.state_dict(),
            "tracker": self.tracking.run_ids() if self.tracking is not None else self._tracker_ids,
            "layout": [self.dims.dp, self.dims.cp, self.dims.tp, self.dims.ep],
        }
        blocked = self.snapshots.start(self.step, self.master, self.optimizer, extra)
        last = self.snapshots.last
        if self.step % self.cfg.log.log_every == 0 and last:
            _log0(
                f"[train] memory snapshot of step {self.step} copied to host memory in {blocked:.3f} s; the one of "
                f"step {last['step']}: {last['bytes']:,} bytes per rank (rank 0), written and sent to the partner in "
                f"{last['written_s']:.3f} s"
            )

    def load(self, path: Path) -> dict:
        """Load a checkpoint's weights and optimizer state (collective); returns its meta."""
        meta = checkpoint.load(path, self.master, self.optimizer)
        if self.master_weights is not None:
            self.master_weights.copy_to_model()
        return meta

    def save(self, background: bool = False) -> Path:
        """Checkpoint the current step; ``background`` (with checkpoint.async_save) returns once the state is in host
        memory and the write is committed at a later step boundary. A save still being written is committed first."""
        self.finish_save()
        meta = {
            "dp": self.dims.dp,
            "tp": self.dims.tp,
            "ep": self.dims.ep,
            "cp": self.dims.cp,
            "global_batch": self.split.global_batch,
            "micro_batch": self.split.micro_batch,
            "grad_accum": self.split.accum,
            "data": self.stream.state_dict(),
            "written_with": self.written_with,
            "tracker": self.tracking.run_ids() if self.tracking is not None else self._tracker_ids,
        }
        stager = self._stager if background else None
        if self.faults.get(self.step) and self.faults[self.step].kind == faults.SLOW_SAVE:
            faults.fire(self.faults[self.step], f"rank {self.rank} on {self.nodes[self.rank]}")
        self.pending = checkpoint.start_save(
            self.cfg.checkpoint_dir,
            self.step,
            self.master,
            self.optimizer,
            meta,
            self.cfg.checkpoint.keep_last,
            self.run_id,
            stager=stager,
            write_group=self._write_group,
        )
        if stager is None:
            return self.finish_save()
        _log0(
            f"[train] checkpoint of step {self.step} copied to host memory in {self.pending.blocked_s:.2f}s, writing "
            "in the background"
        )
        return self.pending.final

    def finish_save(self) -> Path | None:
        """Wait for the save in flight (if any) on every rank and make it the newest complete checkpoint."""
        if self.pending is None:
            return None
        pending, self.pending = self.pending, None
        t0 = time.perf_counter()
        path = checkpoint.commit(pending)
        how = (
            f"the step loop was blocked {pending.blocked_s:.2f}s, and {time.perf_counter() - t0:.2f}s at this commit"
            if pending.background
            else f"written in {pending.blocked_s:.2f}s"
        )
        _log0(f"[train] saved checkpoint {path} ({how})")
        return path

    def _check_steps(self, weights: bool) -> None:
        """Stop the run (exit 1, one line) if a step since it started went wrong (``StepGuard``; ``weights``: check the
        trained weights too, what a save writes), before anything of that step is saved; a save in flight, of an
        earlier step, is committed first and the metrics are written. Collective."""
        problem = self.guard.problem(self.step, self.trainable if weights else ())
        if problem:
            self.finish_save()
            self.metrics.close()
            raise StepFailed(problem)

    def _background_save_written(self) -> bool:
        """Whether every rank finished writing the save in flight (collective)."""
        done = torch.tensor([float(self.pending.future.done())], device=self.device)
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        return bool(done.item())

    def _attention(self) -> contextlib.AbstractContextManager:
        """The sdpa_backend preference (a GPU setting); a no-op for auto and on CPU."""
        if self.cfg.sdpa_backend == "auto" or not self.on_gpu:
            return contextlib.nullcontext()
        return sdpa_kernel(_SDPA_ORDER[self.cfg.sdpa_backend], set_priority=True)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory().to(self.device, non_blocking=True) if self.on_gpu else t

    def _summed_loss(self, input_ids: torch.Tensor, labels: torch.Tensor, *position_ids: torch.Tensor) -> torch.Tensor:
        """The summed cross-entropy over one micro-batch's loss tokens (labels not -100); with cp over this rank's
        slice of the rows, at their global positions."""
        if self.shards is not None:  # packed rows (their own position ids) are refused with cp
            input_ids, labels = self.shards.shard(input_ids), self.shards.shard(labels)
            position_ids = (self.shards.positions().expand_as(input_ids),)
        input_ids, labels = self._to_device(input_ids), self._to_device(labels)
        extra = {"position_ids": self._to_device(position_ids[0])} if position_ids else {}
        if self.on_gpu:
            return self.model(input_ids=input_ids, labels=labels, reduction="sum", **extra)
        logits = self.model(input_ids=input_ids, **extra).logits
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum")

    def evaluate(self) -> float:
        """Mean loss over the held-out rows' loss tokens (all dp ranks; collective; waits for the device). Draws no
        random numbers and leaves the training stream where it is."""
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        with torch.no_grad(), self._attention():
            for mb in self.eval_batches:
                total[0] += self._summed_loss(*mb).double()
                total[1] += (mb[1] != IGNORE).sum().item()
        dist.all_reduce(total, group=self.mesh[DP].get_group())
        return (total[0] / total[1].clamp(min=1)).item()

    def train_step(self) -> dict:
        """One optimizer step over this rank's micro-batches; returns the step's metrics record (global values; loss and
        grad norm as device tensors, read by ``MetricsLog``)."""
        cfg = self.cfg
        lr = lr_at(self.step + 1, cfg.optim.lr, cfg.schedule.warmup_steps, cfg.schedule.min_lr, cfg.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        micro = self.stream.next_microbatches()
        # The loss is the mean over the loss tokens of the whole global batch: each micro-batch's summed loss over the
        # global count. FSDP averages gradients over dp (x cp), hence that factor. The cp ranks of a dp rank hold the
        # same rows, so the count is summed over dp only.
        loss_tokens = torch.stack([(mb[1] != IGNORE).sum() for mb in micro]).sum().to(self.device)
        dist.all_reduce(loss_tokens, group=self.mesh[DP].get_group())
        scale = self.dims.dp * self.dims.cp / loss_tokens.clamp(min=1).float()
        loss_sum = torch.zeros((), device=self.device)
        moe = {}
        real = len(micro) - self.stream.last_padding  # the rest are padding: no loss token, no load-balancing loss
        per_rank = self.split.real_micro_batches / self.dims.dp  # grad accumulation when no rank pads
        with self._attention():
            for i, mb in enumerate(micro):
                loss = self._summed_loss(*mb)
                objective = loss * scale
                if self.moe:  # + coef x the mean load-balancing loss over the global batch's (real) micro-batches
                    aux, counts = routing_summary(self.model)
                    if i >= real:
                        aux, counts = aux * 0, counts * 0
                    objective = objective + self.hf_config.router_aux_loss_coef / per_rank * aux
                    moe["aux"], moe["counts"] = moe.get("aux", 0) + aux.detach(), moe.get("counts", 0) + counts
                objective.backward()
                loss_sum += loss.detach()
        grad_norm = clip_grad_norm_(self.trainable, cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if cfg.fp8.enabled:
            precompute_weight_scales(self.model)
        if self.master_weights is not None:
            self.master_weights.copy_to_model()
        dist.all_reduce(loss_sum, group=self.batch_group)
        self.step += 1
        if self.step % GC_EVERY_STEPS == 0:
            gc.collect(1)
        record = {
            "step": self.step,
            "loss": loss_sum.double() / loss_tokens.clamp(min=1),
            "loss_tokens": loss_tokens,
            "grad_norm": grad_norm,
            "lr": lr,
            "epoch": self.stream.epoch,
            "samples_consumed": self.stream.consumed,
            "peak_mem_gib": peak_memory_gib(self.device),
        }
        return record | (self._moe_metrics(moe) if self.moe else {})

    def _moe_metrics(self, moe: dict) -> dict:
        """The step's mean load-balancing loss (not in ``loss``) and the worst MoE layer's max/mean tokens per expert,
        over the global batch (collective over dp)."""
        stats = torch.cat([moe["aux"].reshape(1), moe["counts"].flatten()])
        dist.all_reduce(stats, group=self.mesh[DP].get_group())
        return {
            "moe_aux_loss": stats[0] / self.split.real_micro_batches,
            "moe_load_imbalance": load_imbalance(stats[1:].view_as(moe["counts"])),
        }

    def run(self, stop_requested: Callable[[], bool] = lambda: False) -> int:
        """Train to ``cfg.steps``, checkpointing every ``checkpoint.interval`` steps and at the end; returns the last
        step."""
        cfg = self.cfg
        self._saved_at = self.step
        if self.step >= cfg.steps:
            _log0(f"[train] the run is already at step {self.step} of steps={cfg.steps}: nothing to train")
        self.metrics.restart_clock()
        step_fn = self.straggler.measured(self.train_step)
        self.beat = Heartbeat(self.rank)  # a job with spare nodes: this rank's phase, for hpc.node.restart
        try:  # a peer lost in a step or in the saves and export at the end: the hang report names it
            self._loop(step_fn, stop_requested)
            self._finish()
        except (RuntimeError, dist.DistError) as e:
            failure = collective_failure(e)
            if failure is None or classify(e).specific:  # a GPU's or NCCL's coded error: the fault table judges it
                raise
            raise self._report_hang(failure) from None
        self.metrics.close()
        self.beat.close()
        return self.step

    def _finish(self) -> None:
        """The run's end: the last save and the export (collective)."""
        cfg = self.cfg
        self.straggler.close()
        self.beat.enter(SAVE, self.step)
        saved_at = self._saved_at
        if saved_at != self.step:  # the steps since the last save, saved below
            self._check_steps(weights=True)
        self.metrics.flush()  # every step's record is written before a checkpoint that resumes after it
        self.finish_save()
        if saved_at != self.step:
            self.save()
        if self._stager is not None:
            self._stager.close()
        if self.snapshots is not None:  # this job run is done with them: no in-job restart follows a clean end
            self.snapshots.close(remove=True)
        if cfg.export and self.step >= cfg.steps:
            target = self.run_dir / cfg.export  # a relative export path lives in the run directory
            if cfg.lora.enabled:
                self._export_lora(target)
            else:
                export_hf(self.master, self.hf_config, self.tokenizer, str(target))
                _log0(f"[train] exported Hugging Face model to {target}")
        dist.barrier()  # rank 0 may still be writing; no rank tears the process group down before it

    def _loop(self, step_fn: Callable[[], dict], stop_requested: Callable[[], bool]) -> None:
        cfg = self.cfg
        interval = cfg.checkpoint.interval
        while self.step < cfg.steps:
            self.beat.enter(STEP if self.step > self.resumed_at else FIRST_STEP, self.step + 1)
            self._step_started = time.monotonic()
            if (self.step + 1) % cfg.log.log_every == 0:  # compute or network? time one step per log line
                record, split = timed_step(step_fn, self.device)
                record.update(split)
            else:
                record = step_fn()
            self.straggler.after_step(self.step, record)
            if cfg.eval.every and self.step % cfg.eval.every == 0:
                self.beat.enter(EVAL, self.step)
                record["eval_loss"] = self.metrics.untimed(self.evaluate)
            self.metrics.log(record)
            self.progress.stepped(self.step)
            self.guard.record(self.step, record["loss"], record["grad_norm"], record["loss_tokens"])
            saving = bool(interval) and self.step % interval == 0
            if saving:
                self.beat.enter(SAVE, self.step)
            if saving or self.step % self.sync_every == 0:
                self._check_steps(weights=saving)
            if saving:
                self.metrics.flush()
                self.save(background=True)
                self._saved_at = self.step
                self.metrics.restart_clock()
            elif self.pending is not None and self.step % self.sync_every == 0 and self._background_save_written():
                self.beat.enter(SAVE, self.step)
                self.finish_save()
            if self.snapshots is not None and self.snapshots.due(self.step):
                if not saving:
                    self._check_steps(weights=True)
                self._snapshot()
            self._test_stop()
            if self.step in self.faults and self.faults[self.step].kind != faults.SLOW_SAVE:
                faults.fire(self.faults[self.step], f"rank {self.rank} on {self.nodes[self.rank]}")
            if stop_requested():  # every step: a host-side collective that never waits for the device
                break
            if self.straggler.persistent:  # the same on every rank: decided from the window's all-gather
                self._exclude_stragglers(self.straggler.persistent)
                break

    def _test_stop(self) -> None:
        """straggler.test_stop_rank (tests only): stop this process (SIGSTOP) after straggler.test_stop_step, in a run
        that did not resume, so that the others time out in the next collective."""
        s = self.cfg.straggler
        if s.test_stop_rank == self.rank and self.step == s.test_stop_step and self.resumed_at == 0:
            print(
                f"[hang] rank {self.rank} on {self.nodes[self.rank]} (pid {os.getpid()}): straggler.test_stop_rank: "
                "stopping myself "
                f"(SIGSTOP) after step {self.step}",
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGSTOP)

    def _exclude_stragglers(self, found: list[dict]) -> None:
        """straggler.stop_after: mark the persistent stragglers' nodes bad (for the batch script) and stop this run."""
        nodes = sorted({f["node"] for f in found})
        self.stopped_for = f"a persistent straggler ({'; '.join(describe(f) for f in found)})"
        if self.rank == 0:
            marked = mark_bad_nodes(nodes)
            where = f"marked bad in {marked}" if marked else "not marked (no HPC_BAD_NODE_MARKS: outside a batch job)"
            print(
                f"[straggler] step {self.step}: stopping with a checkpoint for {self.stopped_for}; "
                f"{', '.join(nodes)} {where}",
                flush=True,
            )

    def _report_hang(self, failure: str) -> CollectiveTimedOut:
        """A collective failed (``failure``: `collective_failure`'s "timeout" or "peer ended"): post this rank's
        arrival,
        let the lowest rank that arrived name those that did not and, after a timeout, mark their nodes bad; returns
        the error that fails the run."""
        elapsed = time.monotonic() - self._step_started
        arrived, missing, peer_ended = name_the_missing(
            f"after step {self.step}", elapsed, self.rank, self.nodes, failure, step=self.step
        )
        if self.rank == 0:
            self.metrics.event(
                {
                    "step": self.step,
                    "event": "hang",
                    "elapsed_s": round(elapsed, 1),
                    "missing": [{"rank": r, "node": self.nodes[r]} for r in missing],
                    "arrived": arrived,
                    "peer_ended": peer_ended,
                }
            )
        what = "failed as a peer's process ended" if peer_ended else "timed out"
        return CollectiveTimedOut(
            f"stopped: a collective {what} after step {self.step} (the [hang] line says who was missing)"
        )
