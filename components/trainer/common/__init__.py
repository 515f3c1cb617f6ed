"""The trainer's bottom layer: facts every layer above reads, importing none.

`task` (the JSON the executor hands every process, and the feature spec its
examples parse with), `progress` (the progress numbers and line), `failures`
and `exit_codes` (what a relaunch can cure, and how a process says so),
`membership` (an elastic cluster's worker counts and data partitions),
`cpu_threads` (a process's op pool), `tf_config` (a process's TF_CONFIG: its
workers, its tasks, whether it is the chief), `split_source` (the files,
compression and index folder a split is read from, on the fly included).
Below them only the strategy registry.
"""
