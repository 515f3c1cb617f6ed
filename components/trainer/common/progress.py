"""Training progress: the numbers the chief records, and the line people read.

Every training process logs a progress line every few seconds through
`LOGGER`; the chief also hands the same numbers to `progress.json` (its
checkpoint folder's progress marker, written at most once a second). The
supervisor of the training processes (`supervisor`, for either launcher)
reads that file every few seconds and logs the line through `LOGGER` in the
executor's process: the component's own log, which a pipeline console shows
(pipelines/console.py lets the `tfx_hpm` loggers' INFO through and sends TFX and
Beam INFO to a file). No TensorFlow import: the supervisor uses it.
"""

import logging
import math
import time
from typing import Any, Callable, Dict, Optional, Tuple

LOGGER = logging.getLogger('tfx_hpm.trainer')
# Training processes log a progress line this often (and after the first
# and the last call); the supervisor relays the chief's record as often.
LINE_EVERY_SECONDS = 5.0
# Key of a progress record written while the chief does what records no
# step for a while: saving a checkpoint ('saving'), tracing a step function
# ('tracing'). The supervisor's hang clock stops meanwhile.
PAUSED = 'paused'


class Every:
  """True at most once per `seconds`: on the first call, then when due."""

  def __init__(self, seconds: float,
               clock: Callable[[], float] = time.monotonic):
    self._seconds = seconds
    self._clock = clock
    self._last = None

  def __call__(self) -> bool:
    now = self._clock()
    if self._last is not None and now - self._last < self._seconds:
      return False
    self._last = now
    return True


def details(*, step: int, train_steps: int, loss: float,
            steps_per_sec: float, steady: bool, examples_per_step: int,
            elapsed_s: float, checkpoints: int,
            last_checkpoint_step: Optional[int]) -> Dict[str, Any]:
  """What `progress.json` carries besides the step (JSON values only).

  The ETA needs a `steady` rate: one that leaves out the first call, which
  traces the step function.
  """
  left = max(0, train_steps - step)
  eta = (0.0 if not left else
         left / steps_per_sec if steady and steps_per_sec > 0 else None)
  return {
      'train_steps': int(train_steps),
      'loss': None if math.isnan(loss) else float(loss),
      'examples_per_sec': float(steps_per_sec * examples_per_step),
      'elapsed_s': float(elapsed_s),
      'eta_s': eta,
      'checkpoints': int(checkpoints),
      'last_checkpoint_step': (None if last_checkpoint_step is None or
                               last_checkpoint_step < 0 else
                               int(last_checkpoint_step)),
  }


def duration(seconds: Optional[float]) -> str:
  if seconds is None:
    return '?'
  seconds = int(round(seconds))
  if seconds < 60:
    return f'{seconds} s'
  if seconds < 3600:
    return f'{seconds // 60} min {seconds % 60:02d} s'
  return f'{seconds // 3600} h {seconds % 3600 // 60:02d} min'


def format_line(record: Dict[str, Any],
                restarts: Optional[int] = None,
                workers: Optional[Tuple[int, int]] = None) -> str:
  """`step 300/1000 (30%), loss 0.4567, 23,800 examples/s, ...`; with
  `workers` (running, full size: an elastic cluster below full size),
  `workers 1/2` too."""
  step, total = record['step'], record['train_steps']
  loss = record.get('loss')
  parts = [
      f'step {step}/{total} ({100 * step // max(total, 1)}%)',
      'loss ' + ('n/a' if loss is None else f'{loss:.4f}'),
      f'{record["examples_per_sec"]:,.0f} examples/s',
      f'elapsed {duration(record["elapsed_s"])}',
      f'ETA {duration(record.get("eta_s"))}',
  ]
  checkpoints = record.get('checkpoints', 0)
  last = record.get('last_checkpoint_step')
  parts.append(f'checkpoints {checkpoints}' +
               (f' (last at step {last})' if last is not None else ''))
  if restarts is not None:
    parts.append(f'restarts {restarts}')
  if workers is not None:
    parts.append(f'workers {workers[0]}/{workers[1]}')
  return 'Training ' + ', '.join(parts)
