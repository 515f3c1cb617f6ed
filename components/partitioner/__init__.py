"""GPipePartitioner: plans and runs GPipe pipeline parallelism.

Pure (no TensorFlow, no TFX): `config` (PartitionerConfig), `partition` (exact
min-max partitioner, heuristics, schedule simulation), `plan` (cost and
memory model, plan.json), `report` (markdown and PNG charts).
TensorFlow, no TFX: `graph` (a Keras model as layer calls in topological
order), `profiling` (per-layer profile), `gpipe` (runs a plan: placement,
micro-batch schedule, re-materialization).
TFX: `component`, `executor`.
"""
