"""Pipeline-parallel runtime: the model graph, the schedules (GPipe, 1F1B)
and the runner that executes a plan."""
