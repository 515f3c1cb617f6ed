"""One training process: chief, worker, ps, or the executor's own.

`task` (the JSON the executor hands every process), `entry` (what each
process runs), `context` (what a process resolves once as it starts: its
config, strategy, role and lengths), `cpu_threads` (its op pool).
"""
