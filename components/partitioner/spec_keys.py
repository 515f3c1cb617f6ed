"""GPipePartitioner's own spec keys.

Its `examples`, `transform_graph`, `module_file` and `module_path` are TFX's
`standard_component_specs` constants; these are its own. Their values name
the exec property and the output channel in pipelines, MLMD and the
Kubeflow IR: never change them.
"""

# Exec property: the PartitionerConfig as JSON.
CONFIG_KEY = 'config'

# Output: the PartitionPlan that HighPerfTrainer reads.
PARTITION_PLAN_KEY = 'partition_plan'
