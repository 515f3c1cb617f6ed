"""HighPerfTrainer: the TFX adapter here, the rest in one subpackage a concept.

- `component`, `executor`, `fn_args`: the TFX side (spec, executor, the stock
  `run_fn` contract); `config` (DistributionConfig), `resolve` (the
  executor's decisions, taken once), `model_run` (what MLMD records),
  `user_module` (the one module loader).
- `strategies/`: the registry (one entry per strategy) and `auto`.
- `cluster/`: the processes of a training: their TF cluster, supervision,
  the local and Ray backends, failure classes, elastic membership.
- `process/`: one training process: its entry point, its task, its context.
- `managed/`: the training loop the trainer owns in managed mode.
- `checkpoint/`: crash-safe checkpoints in a location that survives TFX.
"""
