"""The LoRDO paper's four claims, checked on the quality study's numbers.

Each check returns ``{"claim", "holds", "numbers", "detail"}``; ``detail`` says it
in words with the spread over seeds. Every method runs the same seeds (the same
initialisation and data order per seed), so a comparison of two methods is made
seed by seed: "A beats B" holds only when A's loss is lower at every seed, not just
on the mean, so that a difference inside the seed-to-seed noise does not count.

(a) LoRDO's final validation loss within 2% of low-rank DDP's, with 10x or more
    fewer bytes than low-rank DDP (``communicate="full"``); the ratio against the
    ``"projected"`` variant is reported beside it, with no threshold.
(b) Global projection beats local projection: LoRDO's loss below
    ``lordo_local_projection``'s at every seed.
(c) Without the full-rank term the subspace freezes (the principal-angle similarity
    of successive bases stays at 1, above :data:`FROZEN`) and the loss is worse
    than LoRDO's at every seed.
(d) LoRDO's advantage over the local projection (their loss difference, paired by
    seed) is larger at the smallest rank and batch than at the largest; whether it
    also grows step by step along each axis is reported too.
"""

LOSS_GAP = 0.02
BYTE_RATIO = 10.0
FROZEN = 0.99  # Similarity of successive bases at or above which a subspace is frozen.


def _rows(summary: dict) -> dict:
  return {row["variant"]: row for row in summary["methods"]}


def _noise(*rows: dict) -> str:
  return ", ".join(f"{r['variant']} {r['mean']:.4f} +- {r['spread']:.4f}" for r in rows)


def paired(worse: dict, better: dict) -> list[float]:
  """``worse - better`` final loss, seed by seed (positive: ``better`` wins)."""
  assert worse["seeds"] == better["seeds"]
  return [w - b for w, b in zip(worse["final_val_loss"], better["final_val_loss"], strict=True)]


def _seeds(differences: list[float]) -> str:
  return "per seed " + ", ".join(f"{d:+.4f}" for d in differences)


def matches_low_rank_ddp(summary: dict) -> dict:
  """Claim (a)."""
  rows = _rows(summary)
  lordo, full, projected = rows["lordo"], rows["low_rank_ddp"], rows["low_rank_ddp_projected"]
  gap = (lordo["mean"] - full["mean"]) / full["mean"]
  vs_full = full["bytes"] / lordo["bytes"]
  vs_projected = projected["bytes"] / lordo["bytes"]
  holds = gap <= LOSS_GAP and vs_full >= BYTE_RATIO
  return {
    "claim": "LoRDO within 2% of low-rank DDP's loss, with 10x fewer bytes than its full variant",
    "holds": holds,
    "numbers": {
      "loss_gap": gap,
      "bytes_ratio_vs_full": vs_full,
      "bytes_ratio_vs_projected": vs_projected,
      "lordo_minus_low_rank_ddp": paired(lordo, full),
      "projected_minus_full": paired(projected, full),
    },
    "detail": (
      f"loss gap {100 * gap:+.2f}% on the mean, LoRDO - low-rank DDP "
      f"{_seeds(paired(lordo, full))} ({_noise(lordo, full)}); LoRDO sends {vs_full:.1f}x "
      f"fewer bytes than low-rank DDP (full) and {vs_projected:.2f}x fewer than low-rank "
      f"DDP (projected), whose iterates are the full variant's up to float rounding "
      f"(projected - full {_seeds(paired(projected, full))})"
    ),
  }


def global_beats_local(summary: dict) -> dict:
  """Claim (b)."""
  rows = _rows(summary)
  lordo, local = rows["lordo"], rows["lordo_local_projection"]
  differences = paired(local, lordo)
  return {
    "claim": "global projection beats local projection",
    "holds": all(d > 0 for d in differences),
    "numbers": {"local_minus_global": differences},
    "detail": (
      f"local - global = {local['mean'] - lordo['mean']:+.4f} nats on the mean, "
      f"{_seeds(differences)} ({_noise(lordo, local)})"
    ),
  }


def subspace_freezes(summary: dict) -> dict:
  """Claim (c)."""
  rows = _rows(summary)
  lordo, frozen = rows["lordo"], rows["lordo_global_projection_only"]
  similarity = summary["similarity"]
  lowest = min(similarity["lordo_global_projection_only"]["projection_similarity"])
  moving = similarity["lordo"]["projection_similarity"]
  mean_moving = sum(moving) / len(moving)
  differences = paired(frozen, lordo)
  worse = all(d > 0 for d in differences)
  return {
    "claim": "without the full-rank term the subspace freezes and the loss is worse",
    "holds": lowest >= FROZEN and worse,
    "numbers": {
      "lowest_similarity_without_full_rank": lowest,
      "mean_similarity_lordo": mean_moving,
      "frozen": lowest >= FROZEN,
      "loss_without_minus_with": differences,
      "loss_worse_every_seed": worse,
    },
    "detail": (
      f"the subspace {'freezes' if lowest >= FROZEN else 'does not freeze'}: similarity of "
      f"successive bases without the full-rank term never below {lowest:.4f} (LoRDO's: "
      f"mean {mean_moving:.3f}); the loss is {'' if worse else 'not '}worse at every seed: "
      f"without - with = {frozen['mean'] - lordo['mean']:+.4f} nats on the mean, "
      f"{_seeds(differences)} ({_noise(lordo, frozen)})"
    ),
  }


def advantage_grows(summary: dict) -> dict:
  """Claim (d)."""
  grid = {(r["rank"], r["batch_size"]): r for r in summary["rank_batch"]}
  ranks = sorted({r for r, _ in grid})
  batches = sorted({b for _, b in grid})
  advantage = lambda r, b: grid[r, b]["advantage_mean"]  # noqa: E731
  small, large = advantage(ranks[0], batches[0]), advantage(ranks[-1], batches[-1])
  pairs = lambda xs: zip(xs, xs[1:], strict=False)  # noqa: E731
  along_rank = all(advantage(lo, b) >= advantage(hi, b) for b in batches for lo, hi in pairs(ranks))
  along_batch = all(
    advantage(r, lo) >= advantage(r, hi) for r in ranks for lo, hi in pairs(batches)
  )
  cells = ", ".join(
    f"r={r} b={b}: {grid[r, b]['advantage_mean']:+.4f} +- {grid[r, b]['advantage_spread']:.4f}"
    for r in ranks
    for b in batches
  )
  return {
    "claim": "LoRDO's advantage over local projection grows at small rank and batch",
    "holds": small > large,
    "numbers": {
      "advantage_smallest": small,
      "advantage_largest": large,
      "monotone_in_rank": along_rank,
      "monotone_in_batch": along_batch,
    },
    "detail": (
      f"advantage (local - LoRDO, nats) {cells}; grows as rank falls at every batch: "
      f"{along_rank}; as batch falls at every rank: {along_batch}"
    ),
  }


def check(summary: dict) -> dict:
  """All four claims, keyed a to d."""
  return {
    "a": matches_low_rank_ddp(summary),
    "b": global_beats_local(summary),
    "c": subspace_freezes(summary),
    "d": advantage_grows(summary),
  }
