"""Pipeline-parallel runtime: the model graph and the GPipe schedule."""
