"""OptimizedTransform: the stock Transform plus a tuned input pipeline.

No TFX, no TensorFlow: `config` (TuningConfig and its validation),
`spec_keys` (the keys it adds to the stock Transform's).
TensorFlow, no TFX: `tuning_step` (the tuning as records: planned before
the stock Transform, run on what it wrote), `tuner` (the time-budgeted
search, its `TuningInputs`) over `results` (what it returns), `measurement`
(timing, the deadline), `sources` (what it measures on: the trainer's reader
over the split's index) and `decisions` (cache, placement, input-bound,
search space, shards per split); `consumer` (the model's training-step
rate), `model_preparation` (that step, prepared while Beam runs), `history`
(the previous tuning and training of this pipeline, from their artifact
files), `report` (markdown and PNG chart).
TFX: `component`, `executor` (the stock executor, writing the transformed
examples in bounded shards inside its Beam pipeline, through
`components.patches.transform`, wired to `tuning_step`), `materialized`
(that write's shard counts, counters, shard indexes and storage errors),
`tuning_inputs` (the tuning's records from TFX's dicts: the plan, the split
and files it tunes on), `artifact` (the TunedInputPipeline it writes).
The reader it tunes (`components.data`: the data order's
`ordered_pipeline` over `input_pipeline`'s record source) is the one
HighPerfTrainer runs.
"""
