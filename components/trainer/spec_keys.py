"""HighPerfTrainer's own spec keys, beside the stock Trainer's.

The keys it shares with the stock Trainer (`examples`, `train_args`,
`model_run`, ...) are TFX's `standard_component_specs` constants; these are
the ones it adds. Their values name the exec properties and channels in
pipelines, MLMD and the Kubeflow IR: never change them.
"""

# Exec properties: the DistributionConfig and FaultToleranceConfig as JSON.
DISTRIBUTION_KEY = 'distribution'
FAULT_TOLERANCE_KEY = 'fault_tolerance'

# Optional inputs, from OptimizedTransform and GPipePartitioner.
TUNED_INPUT_PIPELINE_KEY = 'tuned_input_pipeline'
PARTITION_PLAN_KEY = 'partition_plan'
