"""When and how HighPerfTrainer checkpoints, and its `fault_tolerance` option.

`CheckpointConfig` is what the training loop's checkpointing uses,
`SupervisionConfig` what the cluster's supervisor uses;
`FaultToleranceConfig` is the component's `fault_tolerance` exec property:
the keys of both in one flat JSON object. Pure Python: the component
validates it at construction.
"""

import dataclasses
from typing import Optional

from components.json_config import JsonConfig, is_int, is_number
from components.trainer.common import progress

LEASE_MODES = ('fail', 'wait')


def _positive(value) -> bool:
  return is_number(value) and value > 0


@dataclasses.dataclass
class CheckpointConfig(JsonConfig):
  """When and how HighPerfTrainer checkpoints.

  Attributes:
    backup_root: Root of the stable checkpoint location (local path, gs://,
      hdfs://, ...). None lets the executor pick a default under the pipeline
      root.
    save_every_steps: Checkpoint every this many optimizer steps (None: not by
      steps).
    save_every_s: Checkpoint when this much time passed since the last
      one (None: not by time). Both may be set; whichever comes first. For
      fast steps prefer time: a save costs far more than a millisecond step.
    keep_last: Published checkpoints kept; older ones are deleted.
    delete_after_export: Remove the checkpoints once the model is exported.
    lease: What a run does when another live run holds the checkpoint
      folder's lease: 'fail' at once, or 'wait' for it (up to
      lease_timeout_s).
    lease_timeout_s: How long lease='wait' waits.
    lease_heartbeat_s: How often the holder refreshes the lease; a
      lease not refreshed for LEASE_STALE_HEARTBEATS intervals is stale and
      taken over.
  """
  OPTIONS_NAME = 'checkpoint'
  RENAMED = {'save_every_seconds': 'save_every_s',
             'lease_timeout_seconds': 'lease_timeout_s',
             'lease_heartbeat_seconds': 'lease_heartbeat_s'}
  backup_root: Optional[str] = None
  save_every_steps: Optional[int] = 100
  save_every_s: Optional[float] = None
  keep_last: int = 3
  delete_after_export: bool = True
  lease: str = 'fail'
  lease_timeout_s: float = 600.0
  lease_heartbeat_s: float = 10.0

  def validate(self) -> 'CheckpointConfig':
    """Raises ValueError naming the bad value and what is allowed."""
    if self.backup_root is not None and (
        not isinstance(self.backup_root, str) or not self.backup_root.strip()):
      raise ValueError(f'backup_root={self.backup_root!r} must be a non-empty '
                       'path or URI (local, gs://, hdfs://, ...) or None.')
    if self.save_every_steps is not None and not is_int(
        self.save_every_steps, minimum=1):
      raise ValueError(f'save_every_steps={self.save_every_steps!r} must be an '
                       'integer >= 1 or None.')
    if self.save_every_s is not None and not _positive(
        self.save_every_s):
      raise ValueError(f'save_every_s={self.save_every_s!r} must '
                       'be a finite number > 0 or None.')
    if not is_int(self.keep_last, minimum=1):
      raise ValueError(f'keep_last={self.keep_last!r} must be an integer >= 1 '
                       '(the newest checkpoint is always kept).')
    if not isinstance(self.delete_after_export, bool):
      raise ValueError(f'delete_after_export={self.delete_after_export!r} must '
                       'be True or False.')
    if self.lease not in LEASE_MODES:
      raise ValueError(f'lease={self.lease!r} must be one of {LEASE_MODES}.')
    for name in ('lease_timeout_s', 'lease_heartbeat_s'):
      value = getattr(self, name)
      if not _positive(value):
        raise ValueError(f'{name}={value!r} must be a finite number > 0.')
    return self


@dataclasses.dataclass(frozen=True)
class SupervisionConfig:
  """What the cluster's supervisor (`cluster.supervisor.supervise`) allows
  and watches for, under either launcher. The defaults turn every limit
  off; FaultToleranceConfig.supervision() gives the component's.
  """
  # Relaunches of a failed cluster allowed; a relaunch after a task was
  # preempted (it stopped at a checkpoint) or to regrow an elastic cluster
  # is not counted.
  max_restarts: int = 0
  # Wall-clock limit of the whole training (all attempts); the cluster is
  # killed and the training fails past it. 0: no limit.
  timeout_s: float = 0
  # Seconds without a new training step, as the chief's progress record
  # shows (after the attempt's first step, outside checkpoint saves), after
  # which the attempt is judged hung (a collective waiting on a stopped or
  # cut-off peer blocks without failing), killed and relaunched, as one
  # restart. It must exceed the longest call (`steps_per_execution` steps)
  # and the longest pause between calls; 0: no hang detection.
  hang_timeout_s: float = 0
  # While an elastic cluster (distribution min_workers) runs below
  # num_workers, how often it is asked whether the full size fits again;
  # when it does, the workers checkpoint and stop and the cluster is
  # relaunched at full size (not a restart). 0: never.
  rescale_check_s: float = 0
  # A stopped cluster's processes get this long to exit after SIGTERM
  # (to checkpoint) before SIGKILL.
  grace_s: float = 10.0
  # How often the chief's progress record is read, logged and checked for
  # a hang.
  progress_every_s: float = progress.LINE_EVERY_SECONDS


@dataclasses.dataclass
class FaultToleranceConfig(CheckpointConfig):
  """The `fault_tolerance` exec property: checkpoints and supervision.

  One flat JSON object: the keys of CheckpointConfig, for the training
  processes, and the supervisor's (restarts, hangs, the time limit, elastic
  rescaling).

  Attributes:
    skip_unreadable_records: Train on past damaged data files, reading each
      only up to its first unreadable record (`components.data.unreadable`):
      the files are read through once per training first, and every
      skipped file, position and count is logged and recorded on
      `model_run`. Off: a damaged file fails the training naming it.
    max_restarts, timeout_s, hang_timeout_s, rescale_check_s: The
      supervisor's, as SupervisionConfig's fields say; `supervision()`
      hands them to the launcher.
  """
  OPTIONS_NAME = 'fault_tolerance'
  RENAMED = {'save_every_seconds': 'save_every_s',
             'lease_timeout_seconds': 'lease_timeout_s',
             'lease_heartbeat_seconds': 'lease_heartbeat_s',
             'rescale_check_seconds': 'rescale_check_s'}
  max_restarts: int = 2
  timeout_s: float = 0
  skip_unreadable_records: bool = False
  hang_timeout_s: float = 30.0
  rescale_check_s: float = 60.0

  def validate(self) -> 'FaultToleranceConfig':
    super().validate()
    if not is_int(self.max_restarts, minimum=0):
      raise ValueError(f'max_restarts={self.max_restarts!r} must be an integer '
                       '>= 0.')
    if not isinstance(self.skip_unreadable_records, bool):
      raise ValueError(f'skip_unreadable_records='
                       f'{self.skip_unreadable_records!r} must be true or '
                       'false.')
    if not is_number(self.timeout_s) or self.timeout_s < 0:
      raise ValueError(f'timeout_s={self.timeout_s!r} must be a finite number '
                       '>= 0 (0: no limit).')
    if not is_number(self.hang_timeout_s) or self.hang_timeout_s < 0:
      raise ValueError(f'hang_timeout_s={self.hang_timeout_s!r} must be a '
                       'finite number of seconds >= 0 (0: no hang detection).')
    if (not is_number(self.rescale_check_s) or
        self.rescale_check_s <= 0):
      raise ValueError(
          f'rescale_check_s={self.rescale_check_s!r} must be a '
          'finite number of seconds > 0.')
    return self

  def checkpoint(self) -> CheckpointConfig:
    """The checkpoint settings alone (what the training processes use)."""
    return CheckpointConfig(**{f.name: getattr(self, f.name)
                               for f in dataclasses.fields(CheckpointConfig)})

  def supervision(self) -> SupervisionConfig:
    """The supervisor's settings alone (what the launcher's supervisor
    uses); how it stops processes and relays progress keeps its defaults."""
    return SupervisionConfig(max_restarts=self.max_restarts,
                             timeout_s=self.timeout_s,
                             hang_timeout_s=self.hang_timeout_s,
                             rescale_check_s=self.rescale_check_s)
