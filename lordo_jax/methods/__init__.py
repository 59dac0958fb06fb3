"""The methods: complete optimizers, one file a family (docs/api/index.md's table, MATH.md §6).

* :mod:`~lordo_jax.methods.lordo`: :func:`~lordo_jax.lordo`,
  :func:`~lordo_jax.lordo_local_projection`, :func:`~lordo_jax.lordo_global_projection_only`.
* :mod:`~lordo_jax.methods.data_parallel`: :func:`~lordo_jax.average_gradients`,
  :func:`~lordo_jax.ddp`, :func:`~lordo_jax.low_rank_ddp`.
* :mod:`~lordo_jax.methods.local_updates`: :func:`~lordo_jax.local_adam`,
  :func:`~lordo_jax.desloc`, :func:`~lordo_jax.diloco`.
* Shared: :mod:`~lordo_jax.methods.local_step` (the local steps), :mod:`~lordo_jax.methods.options`.
"""
