r"""The methods: complete optimizers, each a chain of the library's pieces.

One file a family, as in README.md's method table (MATH.md §6):

* :mod:`~lordo_jax.methods.lordo`: :func:`~lordo_jax.lordo` and its ablations
  :func:`~lordo_jax.lordo_local_projection` and
  :func:`~lordo_jax.lordo_global_projection_only`.
* :mod:`~lordo_jax.methods.data_parallel`: :func:`~lordo_jax.average_gradients`,
  :func:`~lordo_jax.ddp` and :func:`~lordo_jax.low_rank_ddp`: the gradient averaged
  every step.
* :mod:`~lordo_jax.methods.local_updates`: :func:`~lordo_jax.local_adam`,
  :func:`~lordo_jax.desloc` and :func:`~lordo_jax.diloco`: local AdamW steps,
  synchronised every K steps.

What they share is written once: :mod:`~lordo_jax.methods.local_step` (the local
AdamW and low-rank Adam steps) and :mod:`~lordo_jax.methods.options` (their options'
checks). Communication per step and per ``p x q`` matrix (MATH.md §7): DDP and
low-rank DDP (``full``) ``pq``; low-rank DDP (``projected``) ``rq + pq / T``; Local
Adam ``3pq / K``; DES-LOC ``pq (1/K_x + 1/K_u + 1/K_v)``; DiLoCo ``pq / K``; LoRDO
``(pq + 2rq) / K``.
"""
