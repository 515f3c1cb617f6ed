"""OptimizedTransform: the stock Transform plus a tuned input pipeline.

No TFX, no TensorFlow: `config` (TuningConfig and its validation).
TensorFlow, no TFX: `sharding` (re-shards a materialized split), `tuner` (time-budgeted measurements and decisions), `report`
(markdown and PNG chart).
TFX: `component`, `executor`.
The dataset library it tunes (`components.data.input_pipeline`) is shared
with HighPerfTrainer.
"""
