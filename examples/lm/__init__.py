"""A byte-level language model trained on simulated workers with any lordo_jax method.

One module per concern: ``model`` (the transformer), ``data`` (corpus, validation
split, worker shards), ``optimizers`` (methods by name), ``train`` (the
``shard_map`` loop), ``checkpoints`` (resuming a stopped run exactly), ``metrics``
(what the optimizer state says each step) and ``report`` (table, JSON, plots).
``examples/main.py`` is the command line.
"""
