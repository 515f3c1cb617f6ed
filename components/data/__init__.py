"""The data plane the Transform tuner and the trainer share: the input
pipeline's config and tf.data pipeline (`input_pipeline`), the shard index
(`shard_index`), the training data order over it and its reader
(`data_order`, `ordered_pipeline`), and checks of damaged data and of what
fits in memory (`shard_check`, `unreadable`, `memory_fit`)."""
