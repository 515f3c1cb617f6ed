"""Launchers: where a training's processes run (in the executor's process,
as its supervised children, as Ray actors).

`registry` holds one `LauncherSpec` per launcher, the facts the config
checks, `auto`, the strategy choice and MLMD's record read instead of
comparing names; `backends` holds one class per launcher with its `run`,
chosen in one place (`backends.for_config`).
"""
