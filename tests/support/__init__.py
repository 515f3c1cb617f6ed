"""Test-only helpers: fault injection, drop-in shapes, conformance runs and
the transform test helpers the test modules import. The fixtures the tests
share with the benchmarks (clusters, emulators, hosts, small training
tasks) are in components/testing."""
