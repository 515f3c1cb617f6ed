"""The executor's decisions, each taken once before any process starts.

The mode a module supports, the training length and the launcher `auto`
stands for.
Pure Python (no TFX, no TensorFlow): the component's constructor takes the
same decisions where they need no I/O.
"""

import dataclasses
from typing import Dict, Tuple

from components.trainer.config import AUTO
from components.json_config import check_choice
from components.trainer.config import DistributionConfig
from components.trainer.config import MODES
from components.trainer.launchers import registry as launchers

def resolve_launcher(config: DistributionConfig,
                     process_local: Dict[str, str]
                    ) -> Tuple[DistributionConfig, str]:
  """The launcher `auto` stands for, and why.

  Args:
    config: The validated config.
    process_local: The outputs (and checkpoint root) that live in one
      process, by role ('model', 'model_run', 'checkpoints').
  """
  if config.launcher != AUTO:
    return config, 'requested'
  if not process_local:
    return (dataclasses.replace(config, launcher=launchers.LOCAL.name),
            'outputs and checkpoints are shared storage: training runs in '
            'supervised child processes')
  if config.num_workers != 1 or config.num_ps:
    return (dataclasses.replace(config, launcher=launchers.LOCAL.name),
            f'num_workers={config.num_workers}, num_ps={config.num_ps} need '
            f'child processes, though {process_local} live in this process')
  return (dataclasses.replace(config, launcher=launchers.IN_PROCESS.name),
          f'{sorted(process_local)} at {sorted(process_local.values())} '
          'live in this process (child processes cannot see them): training '
          "runs in the executor's process")


def resolve_mode(mode: str, *, has_build_model: bool, has_run_fn: bool,
                 run_fn_given: bool, module: str) -> str:
  """Managed or run_fn mode for a module with the given entry points.

  Args:
    mode: DistributionConfig.mode.
    has_build_model: The module defines `build_model`.
    has_run_fn: The module (or the `run_fn` parameter) provides `run_fn`.
    run_fn_given: The user passed the `run_fn` component parameter.
    module: How to name the module in errors.
  """
  check_choice('mode', mode, MODES)
  if mode == 'auto':
    if has_build_model and not run_fn_given:
      return 'managed'
    if has_run_fn:
      return 'run_fn'
    raise ValueError(
        f'{module} defines neither build_model(hparams) (managed mode) nor '
        'run_fn(fn_args) (run_fn mode); one of them is required.')
  if mode == 'managed' and not has_build_model:
    raise ValueError(f"mode='managed' needs build_model(hparams) in {module}, "
                     'which does not define it; define it or use '
                     "mode='run_fn'.")
  if mode == 'run_fn' and not has_run_fn:
    raise ValueError(f"mode='run_fn' needs run_fn(fn_args) in {module}, which "
                     "does not define it; define it or use mode='managed'.")
  return mode


def check_train_length(mode: str, train_steps: int, train_epochs: int) -> None:
  """Training length comes from exactly one of steps and epochs."""
  if train_steps and train_epochs:
    raise ValueError(
        f'train_args.num_steps={train_steps} and train_epochs={train_epochs} '
        'both set the training length; set only one.')
  if mode == 'managed' and not (train_steps or train_epochs):
    raise ValueError('Managed mode needs train_args.num_steps > 0 or '
                     'distribution train_epochs > 0; both are 0.')
