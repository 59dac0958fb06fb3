"""state_bytes against MATH.md §8, on GPT-2 small's parameter shapes.

The shapes are abstract (``jax.ShapeDtypeStruct``, ``jax.eval_shape``): nothing of
GPT-2's size is allocated. Layout as in the Hugging Face checkpoint: a fused
``c_attn`` (768 x 2304, the right case), ``attn.c_proj`` (768 x 768), ``mlp.c_fc``
(768 x 3072, right) and ``mlp.c_proj`` (3072 x 768, left) per layer, their biases, two
layer norms per layer and one at the end, token (50257 x 768) and position
(1024 x 768) embeddings. As in the paper, the embeddings are kept off the low-rank
path (``low_rank_labels``); they take the full-rank AdamW path.
"""

import math

import jax
import jax.numpy as jnp
import pytest

import lordo_jax

D = 768
LAYERS = 12
RANK = D // 4
GPT2_PARAMETERS = 124_439_808


def gpt2_small_shapes():
  """GPT-2 small's parameters as ShapeDtypeStructs, float32."""
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
  layer = {
    "ln_1": {"scale": f32(D), "bias": f32(D)},
    "attn": {
      "c_attn": {"kernel": f32(D, 3 * D), "bias": f32(3 * D)},
      "c_proj": {"kernel": f32(D, D), "bias": f32(D)},
    },
    "ln_2": {"scale": f32(D), "bias": f32(D)},
    "mlp": {
      "c_fc": {"kernel": f32(D, 4 * D), "bias": f32(4 * D)},
      "c_proj": {"kernel": f32(4 * D, D), "bias": f32(D)},
    },
  }
  return {
    "wte": f32(50257, D),
    "wpe": f32(1024, D),
    "h": [layer] * LAYERS,
    "ln_f": {"scale": f32(D), "bias": f32(D)},
  }


def no_embeddings(tree):
  """low_rank_labels: every 2-D leaf but the embeddings is low-rank."""

  def label(path, x):
    name = jax.tree_util.keystr(path)
    return len(x.shape) == 2 and "wte" not in name and "wpe" not in name

  return jax.tree_util.tree_map_with_path(label, tree)


PARAMS = gpt2_small_shapes()
SIZES = [math.prod(x.shape) for x in jax.tree.leaves(PARAMS)]
N = sum(SIZES)
# The 48 low-rank matrices (p, q) and the size of every other leaf.
MATRICES = [
  x.shape for path, x in jax.tree_util.tree_leaves_with_path(PARAMS) if "kernel" in str(path)
]
FULL_RANK = N - sum(p * q for p, q in MATRICES)


def low_rank_floats(basis: str = "matrix", side: str = "auto"):
  """MATH.md §8 per matrix, left case pr + 2rq: the basis (n x r, n the larger side;
  or r int32 indices with dct) and the two r x m moments (m the smaller side).
  ``side="galore_std"`` swaps the sides: an m x r basis and r x n moments."""
  total = 0
  for p, q in MATRICES:
    n, m = max(p, q), min(p, q)
    if side == "galore_std":
      n, m = m, n
    total += (n * RANK if basis == "matrix" else RANK) + 2 * RANK * m
  return total


def bookkeeping(state) -> int:
  """Bytes of counters, flags and ledgers: the leaves of 1 or 2 elements, none float."""
  small = [x for x in jax.tree.leaves(state) if 0 < math.prod(x.shape) <= 2]
  assert not any(jnp.issubdtype(x.dtype, jnp.floating) for x in small)
  total = sum(math.prod(x.shape) * x.dtype.itemsize for x in small)
  assert total < 256
  return total


def test_the_shapes_are_gpt2_small():
  assert N == GPT2_PARAMETERS
  assert len(MATRICES) == 4 * LAYERS
  assert sorted(set(MATRICES)) == [(D, D), (D, 3 * D), (D, 4 * D), (4 * D, D)]


def lordo_kwargs(**extra):
  return dict(rank=RANK, sync_every=16, low_rank_labels=no_embeddings, **extra)


# (method, transformation, expected device bytes without bookkeeping, host bytes), all
# float32 (4 bytes) unless said.
CASES = [
  ("ddp", lambda: lordo_jax.ddp(1e-3), 4 * 2 * N, 0),
  (
    "low_rank_ddp",
    lambda: lordo_jax.low_rank_ddp(1e-3, rank=RANK, low_rank_labels=no_embeddings),
    4 * (low_rank_floats() + 2 * FULL_RANK),
    0,
  ),
  ("local_adam", lambda: lordo_jax.local_adam(1e-3, sync_every=16), 4 * 2 * N, 4 * N),
  ("desloc", lambda: lordo_jax.desloc(1e-3, sync_every=16), 4 * 2 * N, 4 * N),
  # The outer Nesterov momentum is only used at a sync, like the anchor: host.
  ("diloco", lambda: lordo_jax.diloco(1e-3, sync_every=16), 4 * 2 * N, 4 * 2 * N),
  (
    "lordo",
    lambda: lordo_jax.lordo(1e-3, **lordo_kwargs()),
    4 * (low_rank_floats() + 2 * FULL_RANK),
    4 * N,
  ),
  (
    "lordo, error feedback",
    lambda: lordo_jax.lordo(1e-3, **lordo_kwargs(error_feedback=True)),
    4 * (low_rank_floats() + 2 * FULL_RANK + sum(p * q for p, q in MATRICES)),
    4 * N,
  ),
  (
    "lordo, bfloat16 error feedback",
    lambda: lordo_jax.lordo(
      1e-3, **lordo_kwargs(error_feedback=True, error_feedback_dtype="bfloat16")
    ),
    4 * (low_rank_floats() + 2 * FULL_RANK) + 2 * sum(p * q for p, q in MATRICES),
    4 * N,
  ),
  (
    "lordo, dct",
    lambda: lordo_jax.lordo(1e-3, **lordo_kwargs(projection="dct")),
    4 * (low_rank_floats("dct") + 2 * FULL_RANK),
    4 * N,
  ),
  (
    "lordo, galore_std",
    lambda: lordo_jax.lordo(1e-3, **lordo_kwargs(side="galore_std")),
    4 * (low_rank_floats(side="galore_std") + 2 * FULL_RANK),
    4 * N,
  ),
  (
    "lordo_local_projection",
    lambda: lordo_jax.lordo_local_projection(1e-3, **lordo_kwargs()),
    4 * (low_rank_floats() + 2 * FULL_RANK),
    4 * N,
  ),
  (
    "lordo_global_projection_only",
    lambda: lordo_jax.lordo_global_projection_only(1e-3, **lordo_kwargs()),
    4 * (low_rank_floats() + 2 * FULL_RANK),
    4 * N,
  ),
]


@pytest.mark.parametrize("name,build,device,host", CASES, ids=[c[0] for c in CASES])
def test_state_bytes_match_spec_section_8_on_gpt2_small(name, build, device, host):
  state = jax.eval_shape(build().init, PARAMS)
  measured = lordo_jax.state_bytes(state)
  # Shapes carry no placement: all on the device; offload=True would move "host".
  expected = {"device": device + host + bookkeeping(state), "host": 0, "offloadable": host}
  assert measured == expected, name


def test_lordo_keeps_a_fraction_of_adamws_device_state():
  """The headline of MATH.md §8 on these shapes: the matrices' state shrinks about 4x."""
  adamw_state = jax.eval_shape(lordo_jax.ddp(1e-3).init, PARAMS)
  lordo_state = jax.eval_shape(lordo_jax.lordo(1e-3, **lordo_kwargs()).init, PARAMS)
  used = lambda state: (
    lordo_jax.state_bytes(state)["device"] - lordo_jax.state_bytes(state)["offloadable"]
  )
  adamw = used(adamw_state) - bookkeeping(adamw_state)
  lordo = used(lordo_state) - bookkeeping(lordo_state)
  matrices = sum(p * q for p, q in MATRICES)
  saved = adamw - lordo
  assert saved == 4 * (2 * matrices - low_rank_floats())
  assert 0.6 * 4 * 2 * matrices < saved < 4 * 2 * matrices


def test_concrete_and_abstract_states_agree():
  params = {"w": jnp.ones((16, 8)), "b": jnp.zeros(8)}
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=4)
  concrete = lordo_jax.state_bytes(tx.init(params))
  assert concrete == lordo_jax.state_bytes(jax.eval_shape(tx.init, params))
  # w: Q 16 x 2, u and v 2 x 8; b: Adam 2 x 8; anchor 16 x 8 + 8, on the device.
  anchor = 4 * (16 * 8 + 8)
  assert concrete["host"] == 0 and concrete["offloadable"] == anchor
  used = concrete["device"] - anchor - bookkeeping(tx.init(params))
  assert used == 4 * (16 * 2 + 2 * 2 * 8 + 2 * 8)


def test_offloaded_state_is_counted_where_it_lies():
  """With offload=True the anchor is in host memory, and state_bytes says so."""
  params = {"w": jnp.ones((16, 8)), "b": jnp.zeros(8)}
  plain = lordo_jax.state_bytes(lordo_jax.lordo(1e-2, rank=2, sync_every=4).init(params))
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=4, offload=True)
  offloaded = lordo_jax.state_bytes(tx.init(params))
  anchor = 4 * (16 * 8 + 8)
  assert offloaded == {
    "device": plain["device"] - anchor,
    "host": anchor,
    "offloadable": anchor,
  }
