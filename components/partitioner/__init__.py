"""GPipePartitioner: plans pipeline parallelism (GPipe or 1F1B schedules).

Pure (no TensorFlow, no TFX): `config` (PartitionerConfig), `partition` (exact
min-max partitioner, heuristics, schedule simulation), `plan` (cost and
memory model, plan.json), `report` (markdown and PNG charts).
TensorFlow, no TFX: `profiling` (per-layer profile).
The runtime that executes a plan (`graph`, `schedules`, `gpipe`, the plan
format) lives in `components.pipeline_parallel`, shared with HighPerfTrainer.
TFX: `component`, `executor`.
"""
