"""GPipePartitioner: plans pipeline parallelism (GPipe or 1F1B schedules).

Pure (no TensorFlow, no TFX): `config` (PartitionerConfig), `partition` (exact
min-max partitioner, heuristics), `plan` (cost and memory model, the plan),
`report` (markdown and PNG charts), `spec_keys` (the component's own keys).
TensorFlow, no TFX: `profiling` (per-layer profile).
The runtime that executes a plan (`graph`, `schedules`, `simulator`,
`placement`, `stage`, `runner`) lives in `components.pipeline_parallel`,
shared with HighPerfTrainer; plan.json's format in
`components.records.partition_plan`.
TFX: `component`, `executor`.
"""
