"""OptimizedTransform: the stock Transform plus a tuned input pipeline.

No TFX, no TensorFlow: `config` (TuningConfig and its validation).
TensorFlow, no TFX: `input_pipeline` (InputPipelineConfig, `build_dataset`,
the library the trainers read with), `sharding` (re-shards a materialized
split), `tuner` (time-budgeted measurements and decisions), `report`
(markdown and PNG chart).
TFX: `component`, `executor`.
"""
