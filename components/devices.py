"""Logical CPU devices: one CPU split into several TensorFlow devices.

Without GPUs, Mirrored/CentralStorage replicas and GPipe stages each need a
device; splitting the CPU gives them one. TensorFlow fixes its devices when
it first runs an op, so this must happen at process start. No TFX import.
"""


def configure_logical_cpus(num_devices: int) -> None:
  """Splits the CPU into `num_devices` logical devices (at least).

  A process that already has that many logical CPUs is left as it is;
  one whose TensorFlow runtime started with fewer gets a RuntimeError.
  """
  if num_devices <= 1:
    return
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices('CPU')[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
  except RuntimeError as e:
    existing = len(tf.config.list_logical_devices('CPU'))
    if existing < num_devices:
      raise RuntimeError(
          f'cannot split the CPU into {num_devices} logical devices: '
          f'TensorFlow already runs in this process with {existing} CPU '
          'device(s). Split it at process start, before any TensorFlow op '
          'runs.') from e
