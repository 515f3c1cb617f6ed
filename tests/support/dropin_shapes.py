"""Stock TFX pipeline shapes the taxi pipeline does not have, built with the
stock classes or with ours swapped in (nothing else changes).

`cached_pipeline`: ImportSchemaGen instead of SchemaGen, a Tuner feeding
`best_hyperparameters` to the Trainer, an Evaluator and a Pusher under
`tfx.dsl.Cond` on the blessing. `span_pipeline`: spans ingested by
CsvExampleGen, a span-window Resolver in front of the Transform, and the
Transform's `analyzer_cache` from the latest TransformCache.
"""

import os
from typing import Optional

from tfx import v1 as tfx
from tfx.types import standard_component_specs

from components import HighPerfTrainer
from components import OptimizedTransform
from pipelines import data
from pipelines import taxi_pipeline

TUNER_MODULE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            'dropin_tuner_module.py')
# The schema TFX's taxi example ships for ImportSchemaGen.
TAXI_SCHEMA = os.path.join(os.path.dirname(data.default_data_root()),
                           'user_provided_schema', 'schema.pbtxt')
TRAIN_STEPS = 20
EVAL_STEPS = 2
HPARAMS = {'hidden_units': [8]}


def _classes(ours: bool):
  if ours:
    return OptimizedTransform, HighPerfTrainer
  return tfx.components.Transform, tfx.components.Trainer


def _trainer(ours, transform, hyperparameters=None,
             module_file: Optional[str] = None):
  _, trainer_class = _classes(ours)
  return trainer_class(
      module_file=module_file or data.default_module_file(),
      examples=transform.outputs[
          standard_component_specs.TRANSFORMED_EXAMPLES_KEY],
      transform_graph=transform.outputs[
          standard_component_specs.TRANSFORM_GRAPH_KEY],
      hyperparameters=hyperparameters,
      train_args=tfx.proto.TrainArgs(num_steps=TRAIN_STEPS),
      eval_args=tfx.proto.EvalArgs(num_steps=EVAL_STEPS),
      custom_config={'hparams': HPARAMS})


def _pipeline(name, root, components, metadata_path):
  return tfx.dsl.Pipeline(
      pipeline_name=name, pipeline_root=root, components=components,
      enable_cache=True,
      metadata_connection_config=(
          tfx.orchestration.metadata.sqlite_metadata_connection_config(
              metadata_path) if metadata_path else None))


def cached_pipeline(ours: bool, data_root: str, root: str,
                    serving_dir: str, metadata_path: Optional[str] = None,
                    module_file: Optional[str] = None,
                    tuner_module: Optional[str] = None) -> tfx.dsl.Pipeline:
  """ImportSchemaGen, Tuner -> Trainer, Evaluator, Cond(blessed) Pusher."""
  transform_class, _ = _classes(ours)
  module_file = module_file or data.default_module_file()
  example_gen = tfx.components.CsvExampleGen(input_base=data_root)
  schema_gen = tfx.components.ImportSchemaGen(schema_file=TAXI_SCHEMA)
  examples = example_gen.outputs[standard_component_specs.EXAMPLES_KEY]
  transform = transform_class(
      examples=examples,
      schema=schema_gen.outputs[standard_component_specs.SCHEMA_KEY],
      module_file=module_file)
  tuner = tfx.components.Tuner(
      module_file=tuner_module or TUNER_MODULE,
      examples=transform.outputs[
          standard_component_specs.TRANSFORMED_EXAMPLES_KEY],
      transform_graph=transform.outputs[
          standard_component_specs.TRANSFORM_GRAPH_KEY],
      train_args=tfx.proto.TrainArgs(num_steps=5),
      eval_args=tfx.proto.EvalArgs(num_steps=EVAL_STEPS))
  trainer = _trainer(
      ours, transform,
      tuner.outputs[standard_component_specs.BEST_HYPERPARAMETERS_KEY],
      module_file)
  model = trainer.outputs[standard_component_specs.MODEL_KEY]
  evaluator = tfx.components.Evaluator(
      examples=examples,
      model=model,
      eval_config=taxi_pipeline.eval_config(0.0, compare_to_baseline=False))
  blessing = evaluator.outputs[standard_component_specs.BLESSING_KEY]
  with tfx.dsl.Cond(blessing.future()[0].custom_property('blessed') == 1):
    pusher = tfx.components.Pusher(
        model=model,
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(
                base_directory=serving_dir)))
  return _pipeline('dropin-cached', root, [
      example_gen, schema_gen, transform, tuner, trainer, evaluator, pusher],
                   metadata_path)


def span_input_config() -> tfx.proto.Input:
  return tfx.proto.Input(splits=[
      tfx.proto.Input.Split(name='single_split', pattern='span-{SPAN}/*')])


def span_pipeline(ours: bool, data_root: str, root: str,
                  metadata_path: Optional[str] = None,
                  module_file: Optional[str] = None,
                  span_window: bool = True) -> tfx.dsl.Pipeline:
  """The latest spans (up to 2) and the latest analyzer cache -> Transform.

  Without `span_window` the Transform reads the latest span only.
  """
  transform_class, _ = _classes(ours)
  module_file = module_file or data.default_module_file()
  example_gen = tfx.components.CsvExampleGen(
      input_base=data_root, input_config=span_input_config())
  schema_gen = tfx.components.ImportSchemaGen(schema_file=TAXI_SCHEMA)
  # As TFX's penguin_pipeline_local: `example_gen.outputs['examples']` would
  # only give the current run's artifact (the compiler adds a pipeline_run
  # context query), so the window reads ExampleGen's outputs of every run
  # through a plain Channel and runs after ExampleGen.
  window = tfx.dsl.Resolver(
      strategy_class=tfx.dsl.experimental.SpanRangeStrategy,
      config={'range_config': tfx.proto.RangeConfig(
          rolling_range=tfx.proto.RollingRange(num_spans=2))},
      examples=tfx.dsl.Channel(
          type=tfx.types.standard_artifacts.Examples,
          producer_component_id=example_gen.id,
          output_key=standard_component_specs.EXAMPLES_KEY)).with_id(
              'span_window')
  window.add_upstream_node(example_gen)
  latest_cache = tfx.dsl.Resolver(
      strategy_class=tfx.dsl.experimental.LatestArtifactStrategy,
      cache=tfx.dsl.Channel(
          type=tfx.types.standard_artifacts.TransformCache)).with_id(
              'latest_analyzer_cache')
  transform = transform_class(
      examples=(window.outputs['examples'] if span_window else
                example_gen.outputs[standard_component_specs.EXAMPLES_KEY]),
      schema=schema_gen.outputs[standard_component_specs.SCHEMA_KEY],
      module_file=module_file,
      analyzer_cache=latest_cache.outputs['cache'])
  trainer = _trainer(ours, transform, module_file=module_file)
  return _pipeline('dropin-spans', root, [
      example_gen, schema_gen, *([window] if span_window else []),
      latest_cache, transform, trainer], metadata_path)
