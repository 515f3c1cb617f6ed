"""Input offload: the trainer's data-order partitions produced by tf.data
service cells on other hosts (or processes), exact and supervised.

A cell is one dispatcher and one worker (`cell`), so a job has one producer
and a fixed order; cells run as local processes or Ray actors (`launch`).
A partition's stream (`stream`) registers the same pipeline the local
reader runs at its position, drops any element it has trained, and on a
lost cell moves to another one or to the local reader (`pool`). `sizing`
chooses the number of cells from measured rates; `config` is the group
that asks for it.
"""
