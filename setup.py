"""tfx-hpm: high-performance modeling components for TFX."""

import setuptools

setuptools.setup(
    name='tfx-hpm',
    version='0.1.0',
    description=('HighPerfTrainer, OptimizedTransform and GPipePartitioner: '
                 'TFX components for fast, distributed, preemption-safe '
                 'training.'),
    # Two supported ends, each with its own lock: TFX 1.16 (Python 3.10,
    # requirements-tfx1.16.lock) and TFX 1.21 (Python 3.11, glibc >= 2.38,
    # requirements-tfx1.21.lock); components/patches guards each end.
    python_requires='>=3.10,<3.12',
    # `kubeflow` has no __init__.py: it is a portion of the PEP 420 namespace
    # the Kubeflow SDKs share (kubeflow.training, kubeflow.trainer), so
    # installing tfx-hpm adds kubeflow.runner, .compiler, .resources and
    # .entrypoint beside them instead of shadowing them.
    packages=setuptools.find_packages(
        include=['components*', 'pipelines*', 'benchmarks*']) + ['kubeflow'],
    install_requires=[
        'tfx>=1.16,<1.22',
        'tensorflow>=2.16,<2.22',
        'tf-keras>=2.16,<2.22',
        'tensorboard>=2.16',
        'tensorflow-transform>=1.16,<1.22',
        'apache-beam[gcp]>=2.60,<3',
        'ml-metadata>=1.16,<1.22',
        'kfp>=2.5,<2.17',
        'protobuf>=3.20,<7',
        'numpy>=1.26,<3',
        'portpicker>=1.6',
        # Multi-node clusters (distribution launcher='ray').
        'ray>=2.40,<2.61',
        'matplotlib>=3.9,<3.12',
        'tenacity>=8.2',
    ],
    extras_require={
        'dev': ['pytest>=8.3', 'pytest-timeout>=2.3', 'nbformat>=5.10',
                # A local GCS server for the gs:// pipeline tests.
                'gcp-storage-emulator>=2026.7.19',
                # `make lint`.
                'ruff>=0.17,<0.18', 'import-linter>=2.15,<3'],
    },
)
