"""One training process: chief, worker, ps, or the executor's own.

`entry` (what each process runs: the top of the trainer's layers under
the executor), `context` (what a process resolves once as it starts: its
config, strategy, role and lengths; read by the loops the entry runs). The
task it starts from and its op pool are `common`'s.
"""
