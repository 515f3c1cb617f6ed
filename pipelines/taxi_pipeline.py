"""The full Chicago taxi pipeline, with pluggable Transform and Trainer.

`create_pipeline` builds CsvExampleGen -> StatisticsGen -> SchemaGen ->
ExampleValidator -> Transform -> Trainer -> (latest blessed model) Resolver ->
Evaluator -> Pusher. `make_transform` / `make_trainer` choose the Transform and
Trainer implementations, so the tfx-hpm components can replace the stock ones
one by one and a stock run stays available for side-by-side comparison.
"""

import dataclasses
import os
from typing import Callable, Dict, List, Optional, Tuple

import tensorflow_model_analysis as tfma
from tfx import v1 as tfx
from tfx.dsl.components.base import base_node
from tfx.types import standard_component_specs

from pipelines import data

TRAINER_ID = 'Trainer'
TRANSFORM_ID = 'Transform'


@dataclasses.dataclass
class TrainerInputs:
  """What a Trainer factory gets: upstream channels and the step counts."""
  examples: tfx.dsl.Channel
  transform_graph: tfx.dsl.Channel
  schema: tfx.dsl.Channel
  module_file: str
  train_steps: int
  eval_steps: int
  # Every output channel of the Transform step, for components that produce
  # more than the stock Transform (e.g. a tuned input pipeline).
  transform_outputs: Dict[str, tfx.dsl.Channel]
  # Extra upstream channels (e.g. a partition plan), keyed by input name.
  extra_inputs: Dict[str, tfx.dsl.Channel] = dataclasses.field(
      default_factory=dict)


TransformFactory = Callable[[tfx.dsl.Channel, tfx.dsl.Channel, str],
                            base_node.BaseNode]
TrainerFactory = Callable[[TrainerInputs], base_node.BaseNode]


def is_module_file(module: str) -> bool:
  """True for a .py path; False for an importable module name.

  Kubeflow images have tfx-hpm installed, so compiled pipelines name the
  module ('pipelines.taxi_module') instead of shipping a file.
  """
  return module.endswith('.py')


def module_kwargs(module: str, function: str) -> Dict[str, str]:
  """Stock TFX keyword arguments that point a component at `module`."""
  if is_module_file(module):
    return {'module_file': module}
  return {function: f'{module}.{function}'}


def stock_transform(examples, schema, module_file):
  return tfx.components.Transform(
      examples=examples, schema=schema,
      **module_kwargs(module_file, 'preprocessing_fn'))


def stock_trainer(inputs: TrainerInputs):
  return tfx.components.Trainer(
      **module_kwargs(inputs.module_file, 'run_fn'),
      examples=inputs.examples,
      transform_graph=inputs.transform_graph,
      schema=inputs.schema,
      train_args=tfx.proto.TrainArgs(num_steps=inputs.train_steps),
      eval_args=tfx.proto.EvalArgs(num_steps=inputs.eval_steps))


def eval_config(accuracy_threshold: float,
                compare_to_baseline: bool = True) -> tfma.EvalConfig:
  """Binary accuracy must reach the threshold (and, comparing, not regress)."""
  change_threshold = tfma.GenericChangeThreshold(
      direction=tfma.MetricDirection.HIGHER_IS_BETTER,
      absolute={'value': -1e-10}) if compare_to_baseline else None
  return tfma.EvalConfig(
      model_specs=[
          tfma.ModelSpec(
              signature_name='serving_default',
              label_key='tips_xf',
              preprocessing_function_names=['transform_features'])
      ],
      slicing_specs=[tfma.SlicingSpec()],
      metrics_specs=[
          tfma.MetricsSpec(metrics=[
              tfma.MetricConfig(
                  class_name='BinaryAccuracy',
                  threshold=tfma.MetricThreshold(
                      value_threshold=tfma.GenericValueThreshold(
                          lower_bound={'value': accuracy_threshold}),
                      change_threshold=change_threshold)),
              tfma.MetricConfig(class_name='ExampleCount'),
          ])
      ])


def upstream(data_root: str) -> Tuple[base_node.BaseNode, ...]:
  """CsvExampleGen -> StatisticsGen -> SchemaGen (inferred feature shapes) on
  the CSVs in `data_root`: what every taxi pipeline and benchmark starts
  with."""
  example_gen = tfx.components.CsvExampleGen(input_base=data_root)
  statistics_gen = tfx.components.StatisticsGen(
      examples=example_gen.outputs[standard_component_specs.EXAMPLES_KEY])
  schema_gen = tfx.components.SchemaGen(
      statistics=statistics_gen.outputs[
          standard_component_specs.STATISTICS_KEY],
      infer_feature_shape=True)
  return example_gen, statistics_gen, schema_gen


def create_pipeline(
    *,
    pipeline_name: str,
    pipeline_root: str,
    serving_model_dir: str,
    data_root: Optional[str] = None,
    module_file: Optional[str] = None,
    metadata_path: Optional[str] = None,
    train_steps: int = 1000,
    eval_steps: int = 150,
    accuracy_threshold: float = 0.6,
    compare_to_baseline: bool = True,
    make_transform: TransformFactory = stock_transform,
    make_trainer: TrainerFactory = stock_trainer,
    extra_trainer_inputs: Optional[Callable[..., Dict]] = None,
    beam_pipeline_args: Optional[List[str]] = None,
    enable_cache: bool = False,
) -> tfx.dsl.Pipeline:
  """Builds the taxi pipeline.

  Args:
    pipeline_name: Name recorded in MLMD.
    pipeline_root: Root of all artifacts; MLMD's SQLite file defaults to
      `<pipeline_root>/metadata.db`.
    serving_model_dir: Where Pusher copies a blessed model.
    data_root: Folder of taxi CSVs; defaults to the copy inside the tfx wheel.
    module_file: Module with preprocessing_fn/run_fn/build_model: a .py path
      or an importable module name; defaults to `pipelines/taxi_module.py`.
    metadata_path: SQLite MLMD file; None uses the default under the root, ''
      leaves the connection to the orchestrator (Kubeflow).
    train_steps: Trainer training steps.
    eval_steps: Trainer evaluation steps.
    accuracy_threshold: Evaluator's lower bound on binary accuracy.
    compare_to_baseline: Also require no regression against the latest
      blessed model (a Resolver feeds it to the Evaluator). False judges each
      model on the accuracy bound alone, e.g. runs that are not ordered by
      quality.
    make_transform: Builds the Transform step from (examples, schema, module).
    make_trainer: Builds the Trainer step from `TrainerInputs`.
    extra_trainer_inputs: Optional callable taking (the transformed examples
      channel, the Transform's outputs, the module file) and returning extra
      components and channels for the trainer, as
      `(components, {input_name: channel})`; used to put e.g. a
      GPipePartitioner between Transform and Trainer.
    beam_pipeline_args: Beam flags for the Beam-based components.
    enable_cache: Reuse unchanged executions from MLMD.
  """
  data_root = data_root or data.default_data_root()
  module_file = module_file or data.default_module_file()
  if metadata_path is None:
    metadata_path = os.path.join(pipeline_root, 'metadata.db')

  example_gen, statistics_gen, schema_gen = upstream(data_root)
  examples = example_gen.outputs[standard_component_specs.EXAMPLES_KEY]
  schema = schema_gen.outputs[standard_component_specs.SCHEMA_KEY]
  example_validator = tfx.components.ExampleValidator(
      statistics=statistics_gen.outputs[
          standard_component_specs.STATISTICS_KEY],
      schema=schema)
  transform = make_transform(examples, schema,
                             module_file).with_id(TRANSFORM_ID)
  transformed_examples = transform.outputs[
      standard_component_specs.TRANSFORMED_EXAMPLES_KEY]

  extra_components, extra_channels = [], {}
  if extra_trainer_inputs is not None:
    extra_components, extra_channels = extra_trainer_inputs(
        transformed_examples, transform.outputs, module_file)
  trainer = make_trainer(
      TrainerInputs(
          examples=transformed_examples,
          transform_graph=transform.outputs[
              standard_component_specs.TRANSFORM_GRAPH_KEY],
          schema=schema,
          module_file=module_file,
          train_steps=train_steps,
          eval_steps=eval_steps,
          transform_outputs=dict(transform.outputs),
          extra_inputs=extra_channels)).with_id(TRAINER_ID)

  components = [
      example_gen, statistics_gen, schema_gen, example_validator, transform,
      *extra_components, trainer,
      *_evaluate_and_push(
          examples, trainer.outputs[standard_component_specs.MODEL_KEY],
          accuracy_threshold, compare_to_baseline, serving_model_dir)
  ]
  return tfx.dsl.Pipeline(
      pipeline_name=pipeline_name,
      pipeline_root=pipeline_root,
      components=components,
      enable_cache=enable_cache,
      metadata_connection_config=(
          tfx.orchestration.metadata.sqlite_metadata_connection_config(
              metadata_path) if metadata_path else None),
      beam_pipeline_args=beam_pipeline_args or [
          '--direct_running_mode=in_memory', '--direct_num_workers=1'
      ])


def _evaluate_and_push(examples: tfx.dsl.Channel, model: tfx.dsl.Channel,
                       accuracy_threshold: float, compare_to_baseline: bool,
                       serving_model_dir: str) -> List[base_node.BaseNode]:
  """The Evaluator that blesses `model` and the Pusher of a blessed model,
  after the latest blessed model's Resolver when comparing to it."""
  baseline = []
  if compare_to_baseline:
    baseline = [tfx.dsl.Resolver(
        strategy_class=tfx.dsl.experimental.LatestBlessedModelStrategy,
        model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
        model_blessing=tfx.dsl.Channel(
            type=tfx.types.standard_artifacts.ModelBlessing)).with_id(
                'latest_blessed_model_resolver')]
  evaluator = tfx.components.Evaluator(
      examples=examples,
      model=model,
      baseline_model=(
          baseline[0].outputs[standard_component_specs.MODEL_KEY]
          if baseline else None),
      eval_config=eval_config(accuracy_threshold, compare_to_baseline))
  pusher = tfx.components.Pusher(
      model=model,
      model_blessing=evaluator.outputs[standard_component_specs.BLESSING_KEY],
      push_destination=tfx.proto.PushDestination(
          filesystem=tfx.proto.PushDestination.Filesystem(
              base_directory=serving_model_dir)))
  return [*baseline, evaluator, pusher]


def trainer_reader_batch(distribution: Optional[Dict] = None) -> int:
  """Examples per batch HighPerfTrainer's input pipeline yields.

  Each replica's batch times the gradient-accumulation steps (the trainer
  reads one such batch per replica per step). With `global_batch_size` and a
  replica count only known at run time (`auto`), one replica is assumed;
  OptimizedTransform then flags a mismatch against the batch the previous
  training actually read.
  """
  from components.trainer.config import DistributionConfig  # pylint: disable=g-import-not-at-top
  config = DistributionConfig.from_dict(dict(distribution or {}))
  replicas = config.expected_replicas() or 1
  return config.per_replica_batch(replicas) * config.gradient_accumulation_steps


def trainer_replica_partitions(distribution: Optional[Dict] = None) -> int:
  """The data order's streams one HighPerfTrainer replica reads (its
  partitions over its replicas), assuming one replica where `auto` leaves
  the count to run time."""
  from components.trainer.common import membership  # pylint: disable=g-import-not-at-top
  from components.trainer.config import DistributionConfig  # pylint: disable=g-import-not-at-top
  config = DistributionConfig.from_dict(dict(distribution or {}))
  replicas = config.expected_replicas() or 1
  return max(1, membership.order_partitions(config, replicas) // replicas)


def hpm_factories(distribution: Optional[Dict] = None,
                  tuning: Optional[Dict] = None,
                  fault_tolerance: Optional[Dict] = None,
                  train_steps: Optional[int] = None
                 ) -> Dict[str, Callable]:
  """`create_pipeline` keyword arguments that use the tfx-hpm components.

  `distribution`, `fault_tolerance` go to HighPerfTrainer, `tuning` to
  OptimizedTransform (None: their defaults). The tuning measures at the
  trainer's batch and streams: `tuning['trainer_batch_size']` defaults to
  `trainer_reader_batch(distribution)`, `trainer_data_partitions` to
  `trainer_replica_partitions(distribution)`, and a `batch_size` that
  differs from the trainer's is flagged in the tuning report. With the
  Trainer's `train_steps`, `trainer_examples` defaults to train_steps x that
  batch: the tuning then spends no more than the reading can save.
  """
  # Imported lazily so a stock-only pipeline never imports our components.
  from components import HighPerfTrainer, OptimizedTransform  # pylint: disable=g-import-not-at-top
  from components.transform import spec_keys as transform_keys  # pylint: disable=g-import-not-at-top
  tuning = dict(tuning or {})
  tuning.setdefault('trainer_batch_size', trainer_reader_batch(distribution))
  tuning.setdefault('trainer_data_partitions',
                    trainer_replica_partitions(distribution))
  if train_steps is not None:
    tuning.setdefault('trainer_examples',
                      train_steps * tuning['trainer_batch_size'])

  def make_transform(examples, schema, module_file):
    return OptimizedTransform(
        examples=examples, schema=schema, tuning=tuning,
        **module_kwargs(module_file, 'preprocessing_fn'))

  def make_trainer(inputs: TrainerInputs):
    trainer_distribution = dict(distribution or {})
    if not is_module_file(inputs.module_file):
      # A module name reaches the trainer as its run_fn path; the module's
      # build_model still makes this managed training.
      trainer_distribution.setdefault('mode', 'managed')
    return HighPerfTrainer(
        **module_kwargs(inputs.module_file, 'run_fn'),
        examples=inputs.examples,
        transform_graph=inputs.transform_graph,
        schema=inputs.schema,
        tuned_input_pipeline=inputs.transform_outputs.get(
            transform_keys.TUNED_INPUT_PIPELINE_KEY),
        train_args=tfx.proto.TrainArgs(num_steps=inputs.train_steps),
        eval_args=tfx.proto.EvalArgs(num_steps=inputs.eval_steps),
        distribution=trainer_distribution,
        fault_tolerance=fault_tolerance,
        **inputs.extra_inputs)

  return {'make_transform': make_transform, 'make_trainer': make_trainer}


def gpipe_partitioner(num_stages: int, batch_size: int) -> Callable:
  """`extra_trainer_inputs` that plans GPipe stages for the trainer.

  The trainer's global batch must match: pass the same `batch_size` as
  `distribution['global_batch_size']`.
  """
  from components import GPipePartitioner  # pylint: disable=g-import-not-at-top
  from components.partitioner import spec_keys as partitioner_keys  # pylint: disable=g-import-not-at-top
  from components.trainer import spec_keys as trainer_keys  # pylint: disable=g-import-not-at-top

  def add_partitioner(transformed_examples, transform_outputs, module):
    module_arg = ({'module_file': module} if is_module_file(module) else
                  {'module_path': module})
    partitioner = GPipePartitioner(
        config={'num_stages': num_stages, 'batch_size': batch_size},
        examples=transformed_examples,
        transform_graph=transform_outputs[
            standard_component_specs.TRANSFORM_GRAPH_KEY],
        **module_arg)
    return [partitioner], {
        trainer_keys.PARTITION_PLAN_KEY:
            partitioner.outputs[partitioner_keys.PARTITION_PLAN_KEY]}

  return add_partitioner
