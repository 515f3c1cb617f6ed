"""Artifact types shared by the tfx-hpm components.

They declare no PROPERTIES: KFP v2 rejects typed artifact properties, so every
piece of metadata goes into custom properties instead. Type names follow the
KFP v2 schema-title form `<namespace>.<Name>`, which its compiler requires.
"""

from tfx.types import artifact


class TunedInputPipeline(artifact.Artifact):
  """A tuned tf.data input-pipeline config (config.json) and its report."""
  TYPE_NAME = 'tfx_hpm.TunedInputPipeline'


class PartitionPlan(artifact.Artifact):
  """A GPipe partition plan (plan.json) with its profile and report."""
  TYPE_NAME = 'tfx_hpm.PartitionPlan'
