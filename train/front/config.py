"""Training configuration: one YAML file plus ``key.sub=value`` overrides, validated once.

Every section forbids unknown keys, so a typo is an error naming the key and the keys
allowed there. ``load_config`` raises ``ConfigError`` with a one-line message.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hpc.node.cli import HpcError, shown
from hpc.node.files import META_BYTES, NotASmallFile, read_json_object, read_small_text
from hpc.node.strict_yaml import YamlError, load_yaml, parse_override
from train.front.data_config import DataConfig
from train.front.tokenizer import check_tokenizer, tokenizer_source


class ConfigError(HpcError):
    """A configuration problem; the message is one line naming the file or key and what is allowed."""


class _Strict(BaseModel):
    """Unknown keys, non-finite numbers and silent conversions (true as 1, 1.5 as an int) are errors."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Dims(_Strict):
    """Qwen3Config fields; a named shape fills them, ``model.dims`` overrides single ones."""

    vocab_size: int | None = Field(None, ge=1)
    hidden_size: int | None = Field(None, ge=1)
    intermediate_size: int | None = Field(None, ge=1)
    num_hidden_layers: int | None = Field(None, ge=1)
    num_attention_heads: int | None = Field(None, ge=1)
    num_key_value_heads: int | None = Field(None, ge=1)
    head_dim: int | None = Field(None, ge=2)
    max_position_embeddings: int | None = Field(None, ge=1)
    rope_theta: float | None = Field(None, gt=0)
    tie_word_embeddings: bool | None = None
    # Qwen3MoeConfig's fields (a shape with num_experts is a mixture of experts)
    num_experts: int | None = Field(None, ge=1)
    num_experts_per_tok: int | None = Field(None, ge=1)
    moe_intermediate_size: int | None = Field(None, ge=1)
    norm_topk_prob: bool | None = None
    router_aux_loss_coef: float | None = Field(None, ge=0)


_QWEN3_COMMON = dict(
    head_dim=128, num_key_value_heads=8, vocab_size=151936, max_position_embeddings=40960, rope_theta=1e6
)

_QWEN3_MOE = dict(
    head_dim=128,
    num_key_value_heads=4,
    vocab_size=151936,
    max_position_embeddings=40960,
    rope_theta=1e6,
    tie_word_embeddings=False,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    router_aux_loss_coef=0.001,
)

# The released Qwen3 models' dimensions (dense, and the mixtures of experts 30B-A3B and 235B-A22B); "tiny" and
# "tiny-moe" are for tests and demos (vocab from the tokenizer).
SHAPES: dict[str, Dims] = {
    "tiny": Dims(
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rope_theta=1e6,
        tie_word_embeddings=False,
    ),
    "0.6B": Dims(
        **_QWEN3_COMMON,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        tie_word_embeddings=True,
    ),
    "1.7B": Dims(
        **_QWEN3_COMMON,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        tie_word_embeddings=True,
    ),
    "4B": Dims(
        **_QWEN3_COMMON,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        tie_word_embeddings=True,
    ),
    "8B": Dims(
        **_QWEN3_COMMON,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        tie_word_embeddings=False,
    ),
    "14B": Dims(
        **_QWEN3_COMMON,
        hidden_size=5120,
        intermediate_size=17408,
        num_hidden_layers=40,
        num_attention_heads=40,
        tie_word_embeddings=False,
    ),
    "32B": Dims(
        **_QWEN3_COMMON,
        hidden_size=5120,
        intermediate_size=25600,
        num_hidden_layers=64,
        num_attention_heads=64,
        tie_word_embeddings=False,
    ),
    "tiny-moe": Dims(
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rope_theta=1e6,
        tie_word_embeddings=False,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        router_aux_loss_coef=0.001,
    ),
    "30B-A3B": Dims(
        **_QWEN3_MOE,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
    ),
    "235B-A22B": Dims(
        **_QWEN3_MOE,
        hidden_size=4096,
        intermediate_size=12288,
        moe_intermediate_size=1536,
        num_hidden_layers=94,
        num_attention_heads=64,
    ),
}


MOE_DIMS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "router_aux_loss_coef")
MODEL_TYPES = ("qwen3", "qwen3_moe")


def model_type_problem(path: str, model_type) -> str | None:
    """Why a model.path directory of this config.json model_type cannot be trained, or None."""
    if model_type in MODEL_TYPES:
        return None
    kind = shown(model_type) if not isinstance(model_type, str) else model_type
    return f"model.path: {path} holds a {kind} model; allowed: {', '.join(MODEL_TYPES)}"


def experts_problem(dims: dict, where: str) -> str | None:
    """A mixture of experts routes each token to num_experts_per_tok of its num_experts experts."""
    experts, top_k = dims.get("num_experts") or dims.get("num_local_experts"), dims.get("num_experts_per_tok")
    if isinstance(experts, int) and isinstance(top_k, int) and top_k > experts:
        return (
            f"{where}num_experts_per_tok={top_k} is more than num_experts={experts}: each token goes to "
            f"num_experts_per_tok of the experts (allowed: 1 to {experts})"
        )
    return None


class RopeScaling(_Strict):
    """YaRN RoPE scaling for sequences past the model's pretraining length (Qwen3: 32768): positions up to factor x
    original_max_position_embeddings; passed to transformers as the model config's rope parameters."""

    rope_type: Literal["yarn"] = "yarn"
    factor: float = Field(gt=1)
    original_max_position_embeddings: int = Field(ge=1)

    @property
    def reach(self) -> int:
        """The longest sequence the scaled positions cover."""
        return int(self.factor * self.original_max_position_embeddings)


class ModelConfig(_Strict):
    """Either ``shape`` (random init with that shape's dims, ``dims`` overriding single ones) or ``path`` (a local HF
    directory)."""

    shape: Literal["tiny", "0.6B", "1.7B", "4B", "8B", "14B", "32B", "tiny-moe", "30B-A3B", "235B-A22B"] | None = None
    path: str | None = None
    dims: Dims = Dims()
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    rope_scaling: RopeScaling | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.shape is None) == (self.path is None):
            raise ValueError(
                f"set exactly one of model.shape ({', '.join(SHAPES)}) or model.path (a local Hugging Face directory)"
            )
        if self.path is not None and self.dims != Dims():
            raise ValueError(
                "model.dims applies only with model.shape; a model.path directory brings its own config.json"
            )
        if self.path is not None and not (Path(self.path) / "config.json").exists():
            raise ValueError(f"model.path: {self.path} has no config.json; give a local Hugging Face model directory")
        if self.shape is not None and SHAPES[self.shape].num_experts is None:
            given = [k for k in MOE_DIMS if getattr(self.dims, k) is not None]
            if given:
                raise ValueError(
                    f"model.dims.{given[0]} applies to a mixture of experts; model.shape {self.shape} is dense "
                    "(no experts): use model.shape tiny-moe, 30B-A3B or 235B-A22B, whose dims it overrides"
                )
        try:
            dims = self.dims_dict()
        except (OSError, ValueError) as e:
            why = (
                e.strerror
                if isinstance(e, OSError) and e.strerror
                else " ".join(str(e).replace(f"{self.path}/", "").split())[:100]
            )
            raise ValueError(f"model.path: {self.path}/config.json cannot be read as JSON ({why})") from None
        if self.path is not None:
            if not isinstance(dims.get("num_attention_heads"), int):
                raise ValueError(f"model.path: {self.path}/config.json has no whole-number num_attention_heads")
            problem = model_type_problem(self.path, dims.get("model_type"))
        else:
            problem = None
        problem = problem or experts_problem(
            dims, f"model.path: {self.path}/config.json: " if self.path else "model.dims."
        )
        if problem:
            raise ValueError(problem)
        return self

    def dims_dict(self) -> dict:
        """The Qwen3Config fields this model gets (vocab_size may be None: taken from the tokenizer)."""
        if self.path is not None:
            return read_json_object(Path(self.path) / "config.json", META_BYTES)
        return SHAPES[self.shape].model_dump(exclude_none=True) | self.dims.model_dump(exclude_none=True)

    def kv_heads(self) -> int:
        dims = self.dims_dict()
        return dims.get("num_key_value_heads") or dims["num_attention_heads"]

    def num_experts(self) -> int:
        """Routed experts per MoE layer; 0 for a dense model."""
        dims = self.dims_dict()
        if self.path is not None and dims.get("model_type") != "qwen3_moe":
            return 0
        return dims.get("num_experts") or dims.get("num_local_experts") or 0  # transformers 5 writes the latter name


class ParallelConfig(_Strict):
    """dp x cp x tp degrees; dp None means world_size // (cp x tp). ep (mixture of experts only): expert parallelism
    inside dp, each group of ep data-parallel ranks splitting the experts and exchanging tokens by all-to-all; it
    divides dp and the experts. cp (context parallelism, dense models, text not packed by document): every sequence
    split over cp ranks, load-balanced where seq_len is a multiple of 2 x cp (train/context_parallel.py)."""

    dp: int | None = Field(None, ge=1)
    tp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)


def cp_problem(cp: int, seq_len: int, packed: bool) -> str | None:
    """What is wrong with ``parallel.cp=cp`` for these sequences, or None when it is allowed."""
    if cp == 1:
        return None
    if packed:
        return (
            f"parallel.cp={cp} splits each sequence over ranks, which rows packed by document (data.format=chat or "
            "data.pack=documents) do not support: use parallel.cp=1, or text with data.pack=stream"
        )
    if seq_len % cp:
        return (
            f"parallel.cp={cp} must divide seq_len={seq_len} (a multiple of 2 x cp = {2 * cp} balances the ranks' "
            "attention work)"
        )
    return None


class OptimConfig(_Strict):
    """AdamW (fused on GPU): the peak learning rate, betas, decoupled weight decay and eps."""

    lr: float = Field(3e-4, gt=0)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.95), strict=False
    )
    weight_decay: float = Field(0.1, ge=0)
    eps: float = Field(1e-8, gt=0)


class ScheduleConfig(_Strict):
    """Linear warmup from 0 to optim.lr over warmup_steps, then cosine decay to min_lr at the last step."""

    warmup_steps: int = Field(0, ge=0)
    min_lr: float = Field(0.0, ge=0)


class CheckpointConfig(_Strict):
    """dir None = <log.dir>/checkpoints; interval 0 = only at the last step; async_save: interval saves copy the
    state to host memory and write it while training goes on (committed at a later step boundary); restart auto
    resumes from the newest checkpoint (refusing one written with other settings), fresh starts over from step 0
    once per job, moving the old checkpoints and metrics.jsonl aside; memory_every N > 0: every N steps each rank's
    state goes to its node's memory and to the next node's (a Slurm job on 2 or more nodes, train/snapshot.py), and
    an in-job restart resumes from the newest such copy when it is newer than the disk checkpoint (0 = off)."""

    dir: str | None = None
    interval: int = Field(0, ge=0)
    keep_last: int = Field(2, ge=1)
    async_save: bool = False
    restart: Literal["auto", "fresh"] = "auto"
    memory_every: int = Field(0, ge=0)


class Fp8Config(_Strict):
    """Float8 training of the decoder's linear layers (train/float8.py; GPU of compute capability >= 8.9, torchao):
    recipe tensorwise (one scale per tensor, float8 all-gather under FSDP) or rowwise (one scale per row)."""

    enabled: bool = False
    recipe: Literal["tensorwise", "rowwise"] = "tensorwise"


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(_Strict):
    """LoRA adapters (train/adapters.py): the base frozen, r x (in + out) adapters on each target projection of every
    decoder layer, output scaled by alpha / r (alpha / sqrt(r) with use_rslora); quantize_base nf4 (QLoRA) stores the
    frozen base projections in 4-bit NormalFloat (torchao; one rank); merge: the export also writes the merged full
    model into <export>/merged."""

    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = list(LORA_TARGETS)
    use_rslora: bool = False
    quantize_base: Literal["none", "nf4"] = "none"
    merge: bool = False

    @field_validator("target_modules", mode="before")
    @classmethod
    def _one_or_list(cls, value):
        return [value] if isinstance(value, str) else value

    @field_validator("target_modules")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        unknown = [n for n in names if n not in LORA_TARGETS]
        if unknown or not names or len(set(names)) != len(names):
            what = f"unknown module {unknown[0]!r}" if unknown else "needs each module once, at least one"
            raise ValueError(f"lora.target_modules: {what} (allowed: {', '.join(LORA_TARGETS)})")
        return names


class EvalConfig(_Strict):
    """Held-out evaluation (packed data: data.format chat or data.pack documents): the rows of ``path`` (prepared like
    the training data, into <data.prepared>/eval) or a ``fraction`` of the training rows (held out by a fixed hash of
    the row, so the split depends on the data alone); every ``every`` steps (0 = never) over the first ``batches``
    global batches of them. It reads no random numbers and leaves the training data position alone."""

    path: str | None = None
    fraction: float = Field(0.0, ge=0, lt=1)
    every: int = Field(0, ge=0)
    batches: int = Field(1, ge=1)


class LogConfig(_Strict):
    """tracker: experiment trackers fed by rank 0 (train/tracking.py); mlflow_uri None = the file store <dir>/mlruns;
    wandb_project: the W&B project (offline unless WANDB_MODE is set)."""

    dir: str = "runs/default"
    log_every: int = Field(10, ge=1)
    tracker: list[Literal["mlflow", "wandb", "tensorboard"]] = []
    mlflow_uri: str | None = None
    wandb_project: str = "hpc-train"

    @field_validator("tracker", mode="before")
    @classmethod
    def _one_or_list(cls, value):
        return [value] if isinstance(value, str) else value  # log.tracker=mlflow

    @field_validator("tracker")
    @classmethod
    def _installed(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError(f"log.tracker: {', '.join(names)} names a tracker twice")
        absent = [name for name in names if importlib.util.find_spec(name) is None]
        if absent:
            raise ValueError(f"log.tracker: {absent[0]} is not installed; pip install 'hpc-train[{absent[0]}]'")
        return names


class StragglerConfig(_Strict):
    """Straggler naming (train/straggler.py): every ``every`` steps (0: off; on GPU rounded up to whole log.log_every
    periods) the ranks exchange their compute-only time per step; a rank slower than the median of the others by more
    than ``threshold`` (0.1: 10%) for ``windows`` windows in a row is named with its node. stop_after (0: never): a
    rank named for that many windows in a row has its node marked bad and the run stops with a checkpoint, so the
    batch script requeues the job without that node (python -m hpc.submit sets it from the profile's
    preemption.exclude_stragglers_after). For tests only: test_slow_rank computes test_slow_s seconds more in every
    step; test_stop_rank stops itself (SIGSTOP) after step test_stop_step, in a run that did not resume."""

    every: int = Field(20, ge=0)
    threshold: float = Field(0.1, gt=0)
    windows: int = Field(3, ge=1)
    stop_after: int = Field(0, ge=0)
    test_slow_rank: int | None = Field(None, ge=0)
    test_slow_s: float = Field(0.0, ge=0)
    test_stop_rank: int | None = Field(None, ge=0)
    test_stop_step: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _stop_after_windows(self) -> StragglerConfig:
        if self.stop_after and self.stop_after < self.windows:
            raise ValueError(
                f"straggler.stop_after={self.stop_after} (a site profile's preemption.exclude_stragglers_after "
                f"sets it) is below straggler.windows={self.windows}: a rank is named after that many "
                "windows; 0 or at least windows"
            )
        return self


class TrainConfig(_Strict):
    """Everything one training run needs. global_batch counts samples of seq_len tokens per
    optimizer step, whatever the layout; micro_batch is the most rows a rank runs at once (gradient accumulation =
    global_batch / dp / micro_batch, rounded up; train/front/batch_split.py); dtype auto means
    bf16 compute on GPU and fp32 on CPU; master_dtype is that of the parameters, their gradients and the
    AdamW state (fp32; bf16 halves their memory, as a plain bf16 loop does, at the cost of small
    updates rounding away); fp8 puts the decoder's linear layers in float8; activation_checkpointing
    is true, false or the fraction of layers checkpointed; activation_offload keeps the checkpointed layers' inputs
    in host memory instead of the GPU's (one rank; train/offload.py); tiled_mlp runs the dense MLPs over the sequence
    in checkpointed tiles of that many tokens (0: off; long sequences, train/tiled_mlp.py); sdpa_backend puts that
    attention kernel first on GPU (auto: PyTorch's choice); steps is the last step, over which the schedule runs;
    export is a directory for the final HF model (relative: inside log.dir) or null."""

    model: ModelConfig
    data: DataConfig = DataConfig()
    parallel: ParallelConfig = ParallelConfig()
    activation_checkpointing: bool | float = Field(False, ge=0, le=1)
    activation_offload: bool = False
    tiled_mlp: int = Field(0, ge=0)
    compile: bool = False
    sdpa_backend: Literal["auto", "cudnn", "flash"] = "auto"
    seq_len: int = Field(ge=1)
    micro_batch: int = Field(ge=1)
    global_batch: int = Field(ge=1)
    optim: OptimConfig = OptimConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    grad_clip: float | None = Field(1.0, gt=0)
    dtype: Literal["auto", "bf16", "fp32"] = "auto"
    master_dtype: Literal["fp32", "bf16"] = "fp32"
    fp8: Fp8Config = Fp8Config()
    seed: int = 0
    steps: int = Field(ge=1)
    checkpoint: CheckpointConfig = CheckpointConfig()
    log: LogConfig = LogConfig()
    eval: EvalConfig = EvalConfig()
    lora: LoraConfig = LoraConfig()
    straggler: StragglerConfig = StragglerConfig()
    export: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.schedule.warmup_steps > self.steps:
            raise ValueError(f"schedule.warmup_steps={self.schedule.warmup_steps} must be <= steps={self.steps}")
        if self.fp8.enabled and self.dtype == "fp32":
            raise ValueError("fp8.enabled=true needs bf16 compute: dtype auto (bf16 on GPU) or bf16, not fp32")
        if self.schedule.min_lr > self.optim.lr:
            raise ValueError(f"schedule.min_lr={self.schedule.min_lr} must be <= optim.lr={self.optim.lr}")
        if self.eval.path is not None and self.eval.fraction:
            raise ValueError(
                "set one of eval.path (another source) or eval.fraction (held out of the training data), not both"
            )
        if self.eval.every and not (self.eval.path or self.eval.fraction):
            raise ValueError(f"eval.every={self.eval.every} needs eval.path or eval.fraction")
        if self.lora.quantize_base != "none" and not self.lora.enabled:
            raise ValueError(f"lora.quantize_base={self.lora.quantize_base} needs lora.enabled=true")
        if self.lora.quantize_base == "nf4" and self.fp8.enabled:
            raise ValueError(
                "lora.quantize_base=nf4 and fp8.enabled=true exclude each other: the base is either NF4 or float8"
            )
        if self.activation_offload and not float(self.activation_checkpointing):
            raise ValueError(
                "activation_offload=true offloads the inputs that checkpointed layers keep: "
                "set activation_checkpointing=true (or a fraction of the layers)"
            )
        if self.tiled_mlp and (self.parallel.tp > 1 or self.model.num_experts()):
            raise ValueError(
                f"tiled_mlp={self.tiled_mlp} tiles a dense MLP over a rank's whole sequence: "
                "not with parallel.tp > 1 or a MoE model; set tiled_mlp=0"
            )
        if (self.eval.every or self.eval.fraction) and not self.data.packed:
            raise ValueError("eval needs data packed by document: data.format=chat or data.pack=documents")
        problem = cp_problem(self.parallel.cp, self.seq_len, self.data.packed)
        if problem:
            raise ValueError(problem)
        scaling = self.model.rope_scaling
        if scaling is not None and self.seq_len > scaling.reach:
            reach = (
                f"factor x original_max_position_embeddings = {scaling.factor:g} x "
                f"{scaling.original_max_position_embeddings} = {scaling.reach}"
            )
            raise ValueError(f"seq_len={self.seq_len} is beyond model.rope_scaling's reach: {reach}")
        problem = self._no_effect()
        if problem:
            raise ValueError(problem)
        return self

    def _no_effect(self) -> str | None:
        """A key given where it does nothing is refused, not ignored (its feature switched off on purpose, ``enabled:
        false``, is a warning instead: ``train.front.run_check.ignored_settings``)."""
        for section, name in ((self.lora, "lora"), (self.fp8, "fp8")):
            unused = sorted(section.model_fields_set - {"enabled"})
            if unused and not section.enabled and "enabled" not in section.model_fields_set:
                return (
                    f"{name}.{unused[0]} is set but {name}.enabled is not: without it the key has no effect"
                    + (" (the run would be a full fine-tune)" if name == "lora" else "")
                    + f"; set {name}.enabled=true, or leave the {name} keys out"
                )
        if self.lora.merge and not self.export:
            return (
                "lora.merge=true writes the merged model into <export>/merged; set export (a directory) or leave "
                "lora.merge out"
            )
        s = self.straggler
        for key, given, needs in (
            ("test_slow_s", s.test_slow_s > 0, s.test_slow_rank is not None),
            ("test_slow_rank", s.test_slow_rank is not None, s.test_slow_s > 0),
            ("test_stop_step", "test_stop_step" in s.model_fields_set, s.test_stop_rank is not None),
        ):
            if given and not needs:
                other = {
                    "test_slow_s": "test_slow_rank",
                    "test_slow_rank": "test_slow_s > 0",
                    "test_stop_step": "test_stop_rank",
                }[key]
                return f"straggler.{key} has no effect without straggler.{other}; set both or neither"
        for key, tracker in (("mlflow_uri", "mlflow"), ("wandb_project", "wandb")):
            if key in self.log.model_fields_set and tracker not in self.log.tracker:
                return f"log.{key} has no effect without {tracker} in log.tracker; add it there or leave log.{key} out"
        return None

    @model_validator(mode="after")
    def _home(self) -> TrainConfig:
        """~ at the start of every path of the config is the home directory, as in data.path and data.tokenizer."""
        for section, key in (
            (self.log, "dir"),
            (self.checkpoint, "dir"),
            (self.model, "path"),
            (self.data, "prepared"),
            (self.eval, "path"),
            (self, "export"),
        ):
            value = getattr(section, key)
            if isinstance(value, str) and value.startswith("~"):
                setattr(section, key, os.path.expanduser(value))
        return self

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else Path(self.log.dir) / "checkpoints"

    @property
    def prepared_dir(self) -> Path:
        return Path(self.data.prepared) if self.data.prepared else Path(self.log.dir) / "data"

    def check_paths(self) -> int | None:
        """The files the run reads and writes, checked before any rank starts (torch-free): the data source (and
        eval.path), the tokenizer's files, and that the export can be created. Raises ConfigError or DataError with one
        line; returns the tokenizer's count of tokens where its tokenizer.json gives it."""
        from train.front.data_sources import source_path

        source_path(self.data)
        if self.eval.path is not None:
            source_path(self.data.model_copy(update={"path": self.eval.path}))
        tokens = check_tokenizer(tokenizer_source(self.data.tokenizer, self.model.path, self.data.format == "chat"))
        if self.export:
            target = Path(self.log.dir) / self.export  # a relative export lives in log.dir
            above = next((p for p in target.parents if p.exists()), None)
            if target.exists() and not target.is_dir() or above is not None and not above.is_dir():
                raise ConfigError(
                    f"export: {target} cannot be created: {target if target.exists() else above} is a file"
                )
        return tokens


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Set ``a.b=value`` pairs in a nested dict (a later one wins: hpc.submit appends each array task's directories);
    values are strict YAML (1e-3, true, null, [0.9, 0.95]; see hpc.node.strict_yaml)."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {shown(item)}: expected key.sub=value, e.g. parallel.tp=2")
        parts = key.split(".")
        node = raw
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {shown(item)}: {'.'.join(parts[: i + 1])} is a value, not a section")
            node = child
        try:
            node[parts[-1]] = parse_override(text, f"override {shown(key)}")
        except YamlError as e:
            raise ConfigError(str(e)) from None
    return raw


def _field_model(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class at ``loc`` inside ``model`` (for listing allowed keys)."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def _one_line(err: ValidationError, source: str) -> str:
    e = err.errors()[0]
    loc = tuple(e["loc"])
    key = ".".join(str(p) for p in loc) or "(top level)"
    if e["type"] == "extra_forbidden":
        parent = _field_model(TrainConfig, loc[:-1])
        allowed = ", ".join(parent.model_fields) if parent else "none"
        return f"{source}: unknown key {key} (allowed here: {allowed})"
    if e["type"] == "missing":
        return f"{source}: {key} is required"
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "value_error":  # raised by our validators, whose messages name the keys
        return f"{source}: {msg}"
    return f"{source}: {key}={shown(e.get('input'))}: {msg}"


def split_cli(args: list[str]) -> tuple[str | None, list[str]]:
    """``--config FILE`` (or ``--config=FILE``) and the ``key=value`` overrides of a trainer command line."""
    config, overrides, rest = None, [], list(args)
    while rest:
        a = rest.pop(0)
        if a == "--config" or a.startswith("--config="):
            if config is not None:
                raise ConfigError("--config given twice; give one file (and key=value overrides)")
            if a == "--config" and not rest:
                raise ConfigError("--config needs a file")
            config = rest.pop(0) if a == "--config" else a.split("=", 1)[1]
        elif "=" in a and not a.startswith("-"):
            overrides.append(a)
        else:
            raise ConfigError(f"trainer argument {shown(a)} is neither --config FILE nor a key.sub=value override")
    return config, overrides


def load_config(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    """Read a YAML config, apply overrides, validate; raises ConfigError with a one-line message."""
    if not str(path).strip() or "\0" in str(path):
        raise ConfigError(f"--config {shown(str(path))}: not a file name")
    path = Path(path)
    try:  # a regular file of bounded size: a directory, a FIFO (whose read would block) or a device is refused unread
        raw = load_yaml(read_small_text(path, META_BYTES), f"--config {path}") or {}
    except NotASmallFile as e:
        raise ConfigError(f"--config {e}") from None
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot read ({e.strerror})") from None
    except YamlError as e:
        raise ConfigError(str(e)) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {path}: top level must be a mapping of keys, e.g. 'steps: 100'")
    return _validated(
        apply_overrides(raw, list(overrides)),
        f"{path}" + (f" (with overrides {' '.join(overrides)})" if overrides else ""),
    )


def with_overrides(cfg: TrainConfig, overrides: list[str]) -> TrainConfig:
    """``cfg`` with more overrides, as ``load_config`` gives its file with them added: applied to the keys the config
    set and validated again."""
    return _validated(
        apply_overrides(cfg.model_dump(exclude_unset=True), list(overrides)), f"overrides {' '.join(overrides)}"
    )


def _validated(raw: dict, source: str) -> TrainConfig:
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_one_line(e, source)) from None
