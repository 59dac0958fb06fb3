"""The rows of the quality study: each a method of ``lordo_jax`` with its options.

A row is a :class:`Variant`: a name for the tables, the ``lordo_jax`` factory it
calls (through ``examples/lm``'s ``get_optimizer``), and the extra keyword arguments
it passes that factory (``TrainConfig.optimizer_options``). To add a row (a
compressed sync, another projection, an adaptive period), append one entry to
:data:`QUALITY`; every study that reads this list trains, tunes and reports it.

A variant whose iterates are those of another one (low-rank DDP communicating only
its projected gradient computes exactly what the ``full`` one computes) names it in
``same_iterates_as``: it is not tuned on its own but trained at the other's best
learning rate, so its bytes come from its own ledger, measured, and its loss shows
the claim of equal iterates.
"""

from typing import Any
from typing import NamedTuple


class Variant(NamedTuple):
  """One row of the quality study."""

  name: str  # Row name in tables, plots and cache files.
  method: str  # The ``lordo_jax`` factory, e.g. "lordo".
  options: tuple[tuple[str, Any], ...] = ()  # Extra keyword arguments of the factory.
  same_iterates_as: str | None = None  # Not tuned: trained at that variant's best LR.
  description: str = ""  # What it communicates, for the tables.


QUALITY = (
  Variant("ddp", "ddp", description="full gradient every step (AdamW)"),
  Variant(
    "low_rank_ddp",
    "low_rank_ddp",
    description="full gradient every step (GaLore on the mean gradient), communicate='full'",
  ),
  Variant(
    "low_rank_ddp_projected",
    "low_rank_ddp",
    (("communicate", "projected"),),
    same_iterates_as="low_rank_ddp",
    description="r x q coordinates every step, full gradient every T steps",
  ),
  Variant("lordo", "lordo", description="pseudo-gradient + r x q moments every K"),
  Variant(
    "lordo_local_projection",
    "lordo_local_projection",
    description="pseudo-gradient every K; each worker's own basis, moments local",
  ),
  Variant(
    "lordo_global_projection_only",
    "lordo_global_projection_only",
    description="as LoRDO with omega = 1 (no full-rank term)",
  ),
  Variant("diloco", "diloco", description="pseudo-gradient every K into outer Nesterov SGD"),
  Variant("desloc", "desloc", description="params every K, moments every 3K and 6K"),
  Variant("local_adam", "local_adam", description="params and both moments every K"),
)

# The two rows of the rank x batch sweep (claim d).
RANK_BATCH = ("lordo", "lordo_local_projection")


def by_name(name: str) -> Variant:
  """The variant of :data:`QUALITY` called ``name``."""
  for variant in QUALITY:
    if variant.name == name:
      return variant
  raise KeyError(f"no quality variant named {name!r}")
