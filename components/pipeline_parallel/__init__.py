"""Pipeline-parallel runtime: the model graph, the schedules (GPipe, 1F1B)
and their simulator, stage placement, one stage's step, and the runner that
executes a plan (`components.records.partition_plan`)."""
