"""Pipeline schedules as the order of tasks on each stage.

Pure Python (no TensorFlow): the runtime chains each stage's ops in this
order and the partitioner's simulator and memory model read the same orders,
so what is planned is what runs.

- `gpipe` (fill-drain): a stage runs the forwards of micro-batches 0..M-1,
  then their backwards in reverse order; it holds all M in flight.
- `1f1b` (PipeDream-Flush): stage s of K runs min(K-s-1, M) warm-up
  forwards, then alternates one forward and one backward, then runs the
  remaining backwards; it holds at most K-s micro-batches in flight. Same
  bubble (K-1)/(M+K-1) as GPipe and the same single optimizer update per
  mini-batch, so the same gradients.
"""

from typing import List, Sequence, Tuple

GPIPE = 'gpipe'
ONE_F_ONE_B = '1f1b'
SCHEDULES = (GPIPE, ONE_F_ONE_B)
FORWARD = 'forward'
BACKWARD = 'backward'

Task = Tuple[str, int]  # (phase, micro-batch)


def check_schedule(schedule) -> str:
  if schedule not in SCHEDULES:
    raise ValueError(f'schedule must be one of {SCHEDULES}, got '
                     f'{schedule!r}.')
  return schedule


def stage_order(schedule: str, num_stages: int, num_microbatches: int,
                stage: int) -> List[Task]:
  """The tasks of `stage` (0-based) in the order it runs them."""
  check_schedule(schedule)
  m = num_microbatches
  if schedule == GPIPE:
    return ([(FORWARD, i) for i in range(m)] +
            [(BACKWARD, i) for i in reversed(range(m))])
  warmup = min(num_stages - stage - 1, m)
  order = [(FORWARD, i) for i in range(warmup)]
  for i in range(m - warmup):
    order += [(FORWARD, warmup + i), (BACKWARD, i)]
  return order + [(BACKWARD, i) for i in range(m - warmup, m)]


def stage_orders(schedule: str, num_stages: int,
                 num_microbatches: int) -> List[List[Task]]:
  return [stage_order(schedule, num_stages, num_microbatches, s)
          for s in range(num_stages)]


def in_flight(order: Sequence[Task]) -> int:
  """Most micro-batches whose forward ran and whose backward has not."""
  live = peak = 0
  for phase, _ in order:
    live += 1 if phase == FORWARD else -1
    peak = max(peak, live)
  return peak


def backward_follows(order: Sequence[Task]) -> List[bool]:
  """Per task: a forward directly followed by its own backward.

  Such a micro-batch gains nothing from re-materialization (nothing runs
  between its forward and backward), which is what remat 'except_last'
  exploits: GPipe's last micro-batch, every micro-batch of 1F1B's last stage.
  """
  return [phase == FORWARD and position + 1 < len(order) and
          order[position + 1] == (BACKWARD, m)
          for position, (phase, m) in enumerate(order)]


def execution_order(orders: Sequence[Sequence[Task]]
                   ) -> List[Tuple[int, str, int]]:
  """All (stage, phase, micro-batch) tasks, each after what it needs.

  A forward needs the previous stage's forward of its micro-batch, a
  backward the next stage's backward of its micro-batch, and every task the
  task before it on its stage.
  """
  num_stages = len(orders)
  done = set()
  position = [0] * num_stages
  result = []
  total = sum(len(order) for order in orders)
  while len(result) < total:
    progressed = False
    for s, order in enumerate(orders):
      while position[s] < len(order):
        phase, m = order[position[s]]
        needed = ((s - 1, FORWARD, m) if phase == FORWARD else
                  (s + 1, BACKWARD, m))
        if 0 <= needed[0] < num_stages and needed not in done:
          break
        done.add((s, phase, m))
        result.append((s, phase, m))
        position[s] += 1
        progressed = True
    if not progressed:
      raise ValueError(f'the stage orders deadlock: {orders}.')
  return result
