"""The exit statuses a training process uses to tell its supervisor what next.

Defined once, for the processes that exit with them (`task_process`) and the
supervisor that acts on them (`supervisor`). No imports: both sides load it.
"""

# EX_TEMPFAIL ("temporary failure, the user is invited to retry"): the process
# was preempted and stopped at a checkpoint; a relaunch resumes, and does not
# use up max_restarts.
PREEMPTED_EXIT_CODE = 75
# EX_CONFIG: a failure that no relaunch can cure (e.g. another run holds the
# checkpoint folder's lease); the supervisor fails at once.
NOT_RETRYABLE_EXIT_CODE = 78
