"""Real fixtures the tests and the benchmarks share: clusters, emulators,
hosts and small training tasks.

- `trainer_testing`: the id-dataset training task, its child processes
  (`python -m components.testing.trainer_testing TASK_JSON`) and what they
  read back; `id_recording_module` is its user module, `faulty_storage` the
  storage faults a task can install.
- `ray_cluster`: a real local Ray cluster; `netns_hosts`: test hosts in
  network namespaces; `gcs_emulator`: a local GCS server.
- `taxi_runs`: the taxi pipeline's upstream runs; `text_records`: small
  text-line splits.

Nothing under components/ outside this package imports it (`make lint`'s
import contracts); test-only helpers stay in tests/support.
"""
