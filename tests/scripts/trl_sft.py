"""A user's TRL script, as TRL's documentation writes one, plus the two lines of hpc.integrations.

    python trl_sft.py --model DIR --data chat.jsonl --out DIR [--max-steps N] [--notice-at STEP --notice-to self|parent]

Rank 0 appends every logged step ({"step", "loss", "grad_norm"}) to OUT/losses.jsonl. ``--notice-at`` is the
tests' stand-in for Slurm: after that step rank 0 sends the pre-stop signal to itself or to its parent
(hpc.node.launch, which leaves it in the notice file).
"""

import argparse
import json
import os
from pathlib import Path

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import SFTConfig, SFTTrainer

from hpc.integrations.checkpoints import newest_complete_checkpoint
from hpc.integrations.transformers import RequeueCallback
from hpc.node.contract import prestop_signal


class LossLog(TrainerCallback):
    def __init__(self, path: Path):
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            with self.path.open("a") as f:
                f.write(
                    json.dumps({"step": state.global_step, "loss": logs["loss"], "grad_norm": logs["grad_norm"]}) + "\n"
                )


class Notice(TrainerCallback):
    def __init__(self, step: int, to: str):
        self.step, self.to = step, to

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and state.is_world_process_zero:
            os.kill(os.getpid() if self.to == "self" else os.getppid(), prestop_signal(os.environ))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-steps", type=int, default=12)
    p.add_argument("--notice-at", type=int)
    p.add_argument("--notice-to", choices=("self", "parent"), default="self")
    a = p.parse_args()
    requeue = RequeueCallback()  # first: it catches Slurm's notice from here on
    args = SFTConfig(
        output_dir=a.out,
        max_steps=a.max_steps,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        logging_steps=1,
        save_steps=4,
        save_total_limit=2,
        max_length=64,
        report_to="none",
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
    )
    callbacks = [requeue, LossLog(Path(a.out) / "losses.jsonl")]
    if a.notice_at:
        callbacks.append(Notice(a.notice_at, a.notice_to))
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(a.model),
        args=args,
        train_dataset=load_dataset("json", data_files=a.data, split="train"),
        processing_class=AutoTokenizer.from_pretrained(a.model),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=newest_complete_checkpoint(a.out))
    trainer.save_model(str(Path(a.out) / "final"))


if __name__ == "__main__":
    main()
