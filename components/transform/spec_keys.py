"""OptimizedTransform's own spec keys, beside the stock Transform's.

The stock Transform's keys are TFX's `standard_component_specs` constants;
these are the ones it adds. Their values name the exec property and the
output channel in pipelines, MLMD and the Kubeflow IR: never change them.
"""

# Exec property: the TuningConfig as JSON.
TUNING_KEY = 'tuning'

# Output: the TunedInputPipeline that HighPerfTrainer reads.
TUNED_INPUT_PIPELINE_KEY = 'tuned_input_pipeline'
