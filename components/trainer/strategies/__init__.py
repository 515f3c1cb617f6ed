"""The tf.distribute strategies the trainer can run.

`registry`: one `StrategySpec` per strategy, everything strategy-specific
(cluster, build, step style, preemption, evaluation, elasticity); `choice`:
what `auto` stands for in an environment, and whether a strategy can run.
"""
