"""HighPerfTrainer: the TFX adapter on top, one subpackage a concept below.

Layers, each importing only those under it (`.importlinter` enforces it):

  component                  the TFX component and its spec
  executor                   TFX's executor: resolves, launches, records
  launchers.backends         one class per launcher, each with its `run`
  model_run | resolve        what MLMD records; the executor's decisions
  process.entry              what each training process runs
  managed | fn_args          the managed loop; run_fn mode's `fn_args`
  process.context            what a process resolves once as it starts
  strategies.choice          what `auto` stands for, building the strategy
  config                     DistributionConfig and its checks
  cluster                    the processes of a training, supervised
  checkpoint                 crash-safe checkpoints
  common | user_module       shared facts (task, progress, failures,
                             membership, cpu threads, TF_CONFIG); the module
                             loader
  strategies.registry        one entry per strategy: its capabilities;
  | spec_keys                the keys our spec adds to the stock Trainer's
  launchers.registry         one entry per launcher: its capabilities

`strategies`, `launchers` and `process` each span two layers: a strategy's
or a launcher's entry is read by everything, the choice needs the config
and a backend runs the processes; a process's context is read by the loop
that its entry runs.
"""
