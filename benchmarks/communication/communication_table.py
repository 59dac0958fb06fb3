"""Bytes each method all-reduces per step, per worker, on GPT-2 small's parameter shapes.

Run: ``python benchmarks/communication/communication_table.py``; prints a markdown table
(pasted into docs/benchmarks.md). Every number is read from the optimizer state with
``lordo_jax.communicated_bytes`` after real ``update`` calls of each method, never
from a formula; the state sizes come from ``lordo_jax.state_bytes``.

How it runs in about a minute on a laptop CPU: which all-reduces fire at a step
depends only on the step counters, and their sizes only on the parameter shapes.
So each step is one jitted ``shard_map`` program (a one-device mesh whose axis is the
worker axis; the ledger counts each worker's payload, which does not depend on M)
that calls ``tx.update`` on a state rebuilt from ``tx.init`` with the previous
step's counters and ledgers, and returns only the new counters and ledgers. XLA
drops every floating-point operation, since none of them reaches an output, so no
GPT-2-sized array is ever allocated. Before the table, :func:`self_check` runs the
same methods on small shapes both ways, full steps on random gradients and the
counters-only steps, and requires identical ledgers at every step.
"""

import argparse
import math

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

import lordo_jax

AXIS = "workers"
D = 768
LAYERS = 12
RANK = D // 4  # 192
K = 16  # sync_every of every local-update method
T = 200  # refresh_every of low-rank DDP (GaLore's default update_proj_gap)
MB = 1e6


def offloaded(sizes: dict[str, int]) -> dict[str, int]:
  """``lordo_jax.state_bytes``'s sizes of an unplaced state, split as ``offload=True``
  places it: the offloadable part on the host, the rest on the device."""
  return {
    "device": sizes["device"] + sizes["host"] - sizes["offloadable"],
    "host": sizes["offloadable"],
  }


def gpt2_shapes(n_layer: int, d: int, vocab: int, context: int, embeddings: bool = True):
  """A GPT-2 model's parameters as float32 ShapeDtypeStructs, Hugging Face layout.

  Per layer a fused ``c_attn`` d x 3d, ``attn.c_proj`` d x d, ``mlp.c_fc`` d x 4d,
  ``mlp.c_proj`` 4d x d, their biases and two layer norms; then the final layer norm,
  and (``embeddings=True``) token (vocab x d) and position (context x d) embeddings.
  """
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
  layer = {
    "ln_1": {"scale": f32(d), "bias": f32(d)},
    "attn": {
      "c_attn": {"kernel": f32(d, 3 * d), "bias": f32(3 * d)},
      "c_proj": {"kernel": f32(d, d), "bias": f32(d)},
    },
    "ln_2": {"scale": f32(d), "bias": f32(d)},
    "mlp": {
      "c_fc": {"kernel": f32(d, 4 * d), "bias": f32(4 * d)},
      "c_proj": {"kernel": f32(4 * d, d), "bias": f32(d)},
    },
  }
  params = {"h": [layer] * n_layer, "ln_f": {"scale": f32(d), "bias": f32(d)}}
  if embeddings:
    params.update(wte=f32(vocab, d), wpe=f32(context, d))
  return params


def gpt2_small_shapes(embeddings: bool = True):
  """GPT-2 small (124M): :func:`gpt2_shapes` with 12 layers of d = 768, a vocabulary
  of 50257 and a context of 1024."""
  return gpt2_shapes(LAYERS, D, 50257, 1024, embeddings)


def no_embeddings(tree):
  """low_rank_labels: every 2-D leaf but the embeddings (as in the paper) is low-rank."""

  def label(path, x):
    name = jax.tree_util.keystr(path)
    return len(x.shape) == 2 and "wte" not in name and "wpe" not in name

  return jax.tree_util.tree_map_with_path(label, tree)


def methods(rank, sync_every, refresh_every, labels):
  """(name, schedule, period in steps, transformation) of every method."""
  low_rank = dict(rank=rank, low_rank_labels=labels)
  lordo = dict(rank=rank, sync_every=sync_every, low_rank_labels=labels, axis_name=AXIS)
  k, r, t = sync_every, rank, refresh_every
  return [
    ("DDP (AdamW)", "full gradient every step", 1, lordo_jax.ddp(1e-3, axis_name=AXIS)),
    (
      "low-rank DDP, `full`",
      f"full gradient every step; r = {r}, T = {t}",
      t,
      lordo_jax.low_rank_ddp(1e-3, refresh_every=t, axis_name=AXIS, **low_rank),
    ),
    (
      "low-rank DDP, `projected`",
      f"r x q coordinates every step, full gradient every T = {t}",
      t,
      lordo_jax.low_rank_ddp(
        1e-3, refresh_every=t, axis_name=AXIS, communicate="projected", **low_rank
      ),
    ),
    (
      "Local Adam",
      f"params + both moments every K = {k}",
      k,
      lordo_jax.local_adam(1e-3, sync_every=k, axis_name=AXIS),
    ),
    (
      "DES-LOC",
      f"params every {k}, first moment every {3 * k}, second every {6 * k}",
      6 * k,
      lordo_jax.desloc(1e-3, sync_every=k, axis_name=AXIS),
    ),
    (
      "DiLoCo",
      f"pseudo-gradient every K = {k} (outer Nesterov SGD)",
      k,
      lordo_jax.diloco(1e-3, sync_every=k, axis_name=AXIS),
    ),
    (
      "**LoRDO**",
      f"pseudo-gradient + r x q moments every K = {k}; r = {r}",
      k,
      lordo_jax.lordo(1e-3, **lordo),
    ),
    (
      "LoRDO, local projection",
      f"pseudo-gradient every K = {k}; moments stay local",
      k,
      lordo_jax.lordo_local_projection(1e-3, **lordo),
    ),
    (
      "LoRDO, global projection only",
      "as LoRDO (omega = 1)",
      k,
      lordo_jax.lordo_global_projection_only(1e-3, **lordo),
    ),
  ]


def _is_counter(path) -> bool:
  """A step counter, a round's sync counters or a ledger field: what decides and records
  the all-reduces (DES-LOC's moments are due by the count of syncs)."""
  names = [getattr(key, "name", None) for key in path]
  return "ledger" in names or names[-1] in ("count", "syncs", "next_sync")


def _with_ledgers(treedef, counters, positions, size):
  """A tree shaped like the state holding only the counters (for communicated_bytes)."""
  leaves = [None] * size
  for i, x in zip(positions, counters, strict=True):
    leaves[i] = x
  return jax.tree.unflatten(treedef, leaves)


def one_worker_program(body):
  """``body`` as one worker of a ``shard_map`` over a one-device mesh axis ``workers``.

  The returned function takes one worker's arguments and returns one worker's outputs:
  the leading worker axis (of size 1) is added and removed inside the one compiled
  program, so a step is one dispatch, with no per-leaf indexing around it.
  """
  mesh = jax.make_mesh((1,), (AXIS,))

  def stacked(*args):
    outputs = body(*jax.tree.map(lambda x: x[0], args))
    return jax.tree.map(lambda x: x[None], outputs)

  worker = jax.shard_map(stacked, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))
  split, whole = jax.NamedSharding(mesh, P(AXIS)), jax.NamedSharding(mesh, P())

  @jax.jit
  def program(*args):
    outputs = worker(*jax.tree.map(lambda x: jax.reshard(x[None], split), args))
    return jax.tree.map(lambda x: x[0], outputs)

  def run(*args):  # Arguments placed as the outputs are: one compile for every call.
    return program(*jax.device_put(args, whole))

  return run


def counter_steps(tx, shapes, steps, read=lordo_jax.communicated_bytes):
  """``read`` (``lordo_jax.communicated_bytes``) of the state after each of ``steps``
  counters-only steps: only the counters (:func:`_is_counter`) go from step to step, so
  XLA leaves out of the program what no counter depends on (the moments, the bases)."""
  abstract = jax.eval_shape(tx.init, shapes)
  flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  positions = [i for i, (path, _) in enumerate(flat) if _is_counter(path)]

  def body(counters):
    # Per-worker values, as a state that enters shard_map split over the workers is.
    varying = lambda x: jax.lax.pcast(x, AXIS, to="varying")  # noqa: E731
    params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    leaves = [varying(x) for x in jax.tree.leaves(tx.init(params))]
    params = jax.tree.map(varying, params)
    for i, x in zip(positions, counters, strict=True):
      leaves[i] = x
    _, state = tx.update(params, jax.tree.unflatten(treedef, leaves), params)
    new = jax.tree.leaves(state)
    return [new[i] for i in positions]

  step = one_worker_program(body)
  counters = [jnp.zeros(flat[i][1].shape, flat[i][1].dtype) for i in positions]
  sent = []
  for _ in range(steps):
    counters = step(counters)
    jax.block_until_ready(counters)
    sent.append(read(_with_ledgers(treedef, counters, positions, len(flat))))
  return sent


def full_steps(tx, params, steps, seed=0):
  """``lordo_jax.communicated_bytes`` after each of ``steps`` real steps on random grads."""

  def body(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  step = one_worker_program(body)
  state = tx.init(params)
  sent = []
  for t in range(steps):
    keys = jax.random.split(jax.random.key(seed + t), len(jax.tree.leaves(params)))
    grads = jax.tree.unflatten(
      jax.tree.structure(params),
      [jax.random.normal(k, x.shape) for k, x in zip(keys, jax.tree.leaves(params), strict=True)],
    )
    params, state = step(params, state, grads)
    jax.block_until_ready((params, state))
    sent.append(lordo_jax.communicated_bytes(state))
  return sent


def self_check():
  """Counters-only steps give the same ledger as full steps, on small shapes."""
  shapes = {"w": (24, 12), "v": (12, 20), "b": (12,)}
  params = {k: jnp.ones(s) * 0.1 for k, s in shapes.items()}
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  for name, _, period, tx in methods(rank=4, sync_every=3, refresh_every=4, labels=None):
    full = full_steps(tx, params, 2 * period + 1)
    counted = counter_steps(tx, abstract, 2 * period + 1)
    assert full == counted, (name, full, counted)
    assert full[-1] > 0, name


def measure(tx, shapes, period):
  """(bytes per step in the second period, bytes of the first period beyond that)."""
  sent = counter_steps(tx, shapes, 2 * period)
  per_step = (sent[2 * period - 1] - sent[period - 1]) / period
  return per_step, sent[period - 1] - per_step * period


def main(argv=None):
  argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
  self_check()
  full_model = gpt2_small_shapes()
  blocks = gpt2_small_shapes(embeddings=False)
  count = lambda tree: sum(math.prod(x.shape) for x in jax.tree.leaves(tree))  # noqa: E731
  rows = []
  for (name, schedule, period, tx), (_, _, _, tx_blocks) in zip(
    methods(RANK, K, T, no_embeddings), methods(RANK, K, T, None), strict=True
  ):
    per_step, one_off = measure(tx, full_model, period)
    per_step_blocks, _ = measure(tx_blocks, blocks, period)
    memory = offloaded(lordo_jax.state_bytes(jax.eval_shape(tx.init, full_model)))
    rows.append((name, schedule, per_step, per_step_blocks, one_off, memory))

  ddp, ddp_blocks = rows[0][2], rows[0][3]
  print(
    f"GPT-2 small shapes: {count(full_model):,} float32 parameters; 48 matrices "
    f"(768 x 2304, 768 x 768, 768 x 3072, 3072 x 768 per layer) low-rank at r = {RANK} "
    f"(d/4), embeddings (50257 x 768, 1024 x 768), biases and norms on the full-rank "
    f"AdamW path; K = {K}, T = {T}. 'Blocks only' drops the embeddings "
    f"({count(blocks):,} parameters). Bytes all-reduced per worker per step, averaged "
    "over one full period of each schedule after the first, read from the ledger; a "
    "ring all-reduce moves 2(M-1)/M times this over each link. One-off: the extra "
    "message of the first period (LoRDO's averaged first gradient). State: "
    "lordo_jax.state_bytes, per worker, placed as offload=True places it (the anchor and "
    "outer state on the host; without offload all of it is on the device).\n"
  )
  print(
    "| method | what is all-reduced | MB / step | DDP / this | blocks only: MB / step "
    "| DDP / this | one-off MB | state on device MB | state on host MB |"
  )
  print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
  for name, schedule, per_step, per_step_blocks, one_off, memory in rows:
    print(
      f"| {name} | {schedule} | {per_step / MB:.2f} | {ddp / per_step:.1f} | "
      f"{per_step_blocks / MB:.2f} | {ddp_blocks / per_step_blocks:.1f} | "
      f"{one_off / MB:.1f} | {memory['device'] / MB:.0f} | {memory['host'] / MB:.0f} |"
    )


if __name__ == "__main__":
  main()
