"""The module's training step, built and traced in a thread while the stock
Transform's Beam pipeline runs, so that measuring the consumer afterwards
costs only its timed seconds. No TFX."""

import functools
import threading
from typing import Any, Callable, Optional, Tuple

from components.transform import consumer as consumer_lib
from components.transform import report
from components.transform.results import ConsumerFn, ConsumerRate

# Longest wait for the preparing thread after Beam finished.
JOIN_S = 120.0


def _user_function(fn: Callable[..., Any]) -> Callable[..., Any]:
  """The module-level function behind a (custom-config bound) callable."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  return getattr(fn, '__wrapped__', fn)


class ModelPreparation:
  """The model step of the module defining `preprocessing_fn`, prepared in
  a thread from construction on; or, where the module defines no model, why
  not (`note`)."""

  def __init__(self, preprocessing_fn: Callable[..., Any]):
    module = getattr(_user_function(preprocessing_fn), '__globals__', {})
    build_model, label_key = module.get('build_model'), module.get(
        'LABEL_KEY')
    name = module.get('__name__', 'the module')
    self.step: Optional[consumer_lib.ModelStep] = None
    self.note = ''
    self._error: Optional[BaseException] = None
    if not callable(build_model) or not isinstance(label_key, str):
      self.note = (
          f'{name} defines no build_model(hparams) and LABEL_KEY, so the '
          'consumer was not measured; searching as before.')
      self._thread = None
      return
    self.step = consumer_lib.ModelStep(build_model, label_key)
    self._thread = threading.Thread(target=self._prepare, daemon=True,
                                    name='tfx_hpm_prepare')
    self._thread.start()

  def _prepare(self) -> None:
    try:
      self.step.prepare()
      report.warm_up()  # Imports matplotlib meanwhile, too.
    except Exception as e:  # pylint: disable=broad-except
      self._error = e

  def prepared_step(self, timeout: float) -> consumer_lib.ModelStep:
    """The prepared step; re-raises what preparing it raised."""
    self._thread.join(timeout)
    if self._thread.is_alive():
      raise TimeoutError(f'still running after {timeout:.0f} s')
    if self._error is not None:
      raise self._error
    return self.step


def consumer(preparation: Optional[ModelPreparation], batch: int,
             seconds: float) -> Tuple[Optional[ConsumerFn], str]:
  """(the measuring function of the prepared model step, ''), or (None, why
  not)."""
  if preparation is None:
    return None, ('The module was not loaded, so the consumer was not '
                  'measured; searching as before.')
  if preparation.step is None:
    return None, preparation.note
  try:
    step = preparation.prepared_step(JOIN_S)
  except Exception as e:  # pylint: disable=broad-except
    return None, (f'Building the model for the consumer failed '
                  f'({type(e).__name__}: {e}); searching as before.')

  def measure(sample):
    rate = step.rate(sample, seconds)
    return ConsumerRate(
        rate, 'the model\'s training step (build_model, default hparams, '
        'one device)', batch)
  return measure, ''
