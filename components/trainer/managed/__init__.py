"""Managed mode: the trainer owns the loop; the module only builds a model.

`training` runs the phases (build, restore, train, evaluate and export), each
returning a complete record the next takes; `datasets` (what it reads),
`accumulation` (the per-replica update), `step_runners` (k steps per call:
synchronous, parameter servers, GPipe), `call_size` (choosing k), `driver`
(the loop: calls, saves, preemption, progress), `votes`, `preemption`,
`evaluation`, `export`, `warm_start`, `precision`, `xla`.
"""
