"""The streaming path: text sources read per host by tf.data, tokenized on the fly, packed into rows.

Quick runs and the demo train from here; its resume replays the stream (cost grows with the run).
Long runs prepare a token store once (mlm_jax/data/store/) instead. Both give the same batch dict.
"""
