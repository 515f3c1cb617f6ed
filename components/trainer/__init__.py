"""HighPerfTrainer: the TFX adapter on top, one subpackage a concept below.

Layers, each importing only those under it (`.importlinter` enforces it):

  component                  the TFX component and its spec
  executor                   TFX's executor: resolves, launches, records
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

`strategies` and `process` each span two layers: a strategy's entry is
read by everything, the choice needs the config; a process's context is
read by the loop that its entry runs.
"""
