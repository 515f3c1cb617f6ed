"""Test harnesses: emulators, fault injection, clusters and the shared trainer
and transform test helpers the test modules import."""
