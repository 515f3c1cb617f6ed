"""TFX user modules of `benchmarks/bench_precision.py`."""
