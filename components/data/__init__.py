"""The tf.data input pipeline that the Transform tuner and the trainer share."""
