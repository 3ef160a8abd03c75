"""Your own transformers Trainer, TRL SFTTrainer or accelerate script joins the stop-and-requeue contract
(`hpc.node.contract`): `transformers.RequeueCallback`, `accelerate.Requeue`, and
`checkpoints.newest_complete_checkpoint` to resume. Imports nothing of hpc/ but hpc.node."""
