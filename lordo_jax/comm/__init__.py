"""Communication: every message between workers, counted.

One all-reduce helper that updates a :class:`Ledger` with what it sends
(:func:`counted_pmean`, and the compressed mean with its bfloat16 / int8 codecs),
low-rank DDP's mean of projected coordinates, and :func:`worker_disagreement`, a
check that the workers agree.
"""

from lordo_jax.comm._agreement import worker_disagreement
from lordo_jax.comm._collectives import Ledger
from lordo_jax.comm._collectives import counted_pmean

__all__ = ["Ledger", "counted_pmean", "worker_disagreement"]
