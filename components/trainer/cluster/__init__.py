"""The processes of one training, and keeping them running.

`tf_cluster` (tasks, roles, TF_CONFIGs), `supervisor` (attempts, outcomes,
relaunch or fail) over two backends: `local_backend` (child processes here)
and `ray_backend` with `ray_actor` and `ray_placement` (Ray actors across
nodes); `progress_relay` and `log_tail` (what the supervisor shows). What a
relaunch can cure and an elastic cluster's counts are `common`'s. No
TensorFlow import.
"""
