"""Crash-safe, verifiable training checkpoints in a location that survives TFX.

One concept, one module each: `config` (when and how to checkpoint, and the
`fault_tolerance` exec property around it), `location` (where: a folder
named by the training's fingerprint), `lease` (which run may write there),
`store` (save, publish, prune, verify, restore), `records` (the run's
events and progress marker) and `checkpointer` (what the training loop
uses: cadence, restore with its story).

Layout of one checkpoint directory (any `tf.io.gfile` filesystem):

  ckpt-000000000120/          the checkpoint after 120 optimizer steps
    ckpt.index, ckpt.data-*   tf.train.Checkpoint.write output
    MANIFEST.json             step, every file's size, the index's sha256
  LEASE.json                  which run may write, prune and delete here
  events.json                 resume events of every attempt (chief only)
  progress.json               last step reached, so a restart knows what it
                              lost, with the progress the supervisor logs
"""
