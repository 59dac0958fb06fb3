"""A small decoder-only transformer language model over bytes, in Flax NNX.

The vocabulary is the 256 byte values, so no tokenizer is needed. Each block is
pre-norm attention plus a pre-norm MLP. Every weight matrix of the blocks is a plain
2-D kernel, so LoRDO sees it as one ``p x q`` matrix; the byte embedding, the
position embedding and the output head are the usual exclusions from the low-rank
path (see :func:`low_rank_labels`).

The optimizers work on pure dicts of arrays (``nnx.to_pure_dict``); :func:`init`
returns such a dict together with a pure ``apply(params, tokens_BT)``.

Names carry shapes: B batch, T time, D model width, H heads, K head width, V vocab.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

VOCAB_SIZE = 256
EXCLUDED_FROM_LOW_RANK = ("embed", "position", "head")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape of the transformer."""

  d_model: int
  num_layers: int
  num_heads: int
  seq_len: int  # Context length T (the model also sees a target for each position).
  mlp_ratio: int = 4
  vocab_size: int = VOCAB_SIZE


PRESETS = {
  "tiny": ModelConfig(d_model=32, num_layers=1, num_heads=2, seq_len=32),
  "small": ModelConfig(d_model=128, num_layers=2, num_heads=4, seq_len=64),
  "base": ModelConfig(d_model=256, num_layers=4, num_heads=8, seq_len=128),
}


def _dense(d_in: int, d_out: int, rngs: nnx.Rngs, scale: float = 1.0) -> nnx.Linear:
  init = nnx.initializers.normal(0.02 * scale)
  return nnx.Linear(d_in, d_out, use_bias=False, kernel_init=init, rngs=rngs)


class Attention(nnx.Module):
  """Causal multi-head self-attention with four ``D x D`` projections."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    d, out_scale = config.d_model, (2 * config.num_layers) ** -0.5
    self.num_heads = config.num_heads
    self.query = _dense(d, d, rngs)
    self.key = _dense(d, d, rngs)
    self.value = _dense(d, d, rngs)
    self.out = _dense(d, d, rngs, out_scale)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    b, t, d = x_BTD.shape
    split = lambda y: y.reshape(b, t, self.num_heads, d // self.num_heads)  # noqa: E731
    q_BTHK, k_BTHK, v_BTHK = (split(f(x_BTD)) for f in (self.query, self.key, self.value))
    y_BTHK = jax.nn.dot_product_attention(q_BTHK, k_BTHK, v_BTHK, is_causal=True)
    return self.out(y_BTHK.reshape(b, t, d))


class MLP(nnx.Module):
  """``D -> mlp_ratio D -> D`` with a GELU."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    d, hidden = config.d_model, config.mlp_ratio * config.d_model
    self.up = _dense(d, hidden, rngs)
    self.down = _dense(hidden, d, rngs, (2 * config.num_layers) ** -0.5)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    return self.down(jax.nn.gelu(self.up(x_BTD)))


class Block(nnx.Module):
  """Pre-norm residual block: attention, then MLP."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    self.attention_norm = nnx.RMSNorm(config.d_model, rngs=rngs)
    self.attention = Attention(config, rngs)
    self.mlp_norm = nnx.RMSNorm(config.d_model, rngs=rngs)
    self.mlp = MLP(config, rngs)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    x_BTD = x_BTD + self.attention(self.attention_norm(x_BTD))
    return x_BTD + self.mlp(self.mlp_norm(x_BTD))


class Transformer(nnx.Module):
  """Byte embedding + learned positions, ``num_layers`` blocks, norm, output head."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    d = config.d_model
    self.embed = nnx.Embed(
      config.vocab_size, d, embedding_init=nnx.initializers.normal(0.02), rngs=rngs
    )
    self.position = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (config.seq_len, d)))
    self.blocks = nnx.List([Block(config, rngs) for _ in range(config.num_layers)])
    self.final_norm = nnx.RMSNorm(d, rngs=rngs)
    self.head = _dense(d, config.vocab_size, rngs)

  def __call__(self, tokens_BT: jax.Array) -> jax.Array:
    """Logits ``(B, T, V)`` of the next byte at each position."""
    x_BTD = self.embed(tokens_BT) + self.position[: tokens_BT.shape[1]]
    for block in self.blocks:
      x_BTD = block(x_BTD)
    return self.head(self.final_norm(x_BTD))


def init(config: ModelConfig, seed: int) -> tuple[Callable, dict]:
  """``(apply, params)``: a pure ``apply(params, tokens_BT) -> logits_BTV`` and params.

  ``params`` is a pure dict of float32 arrays, ready for any optax optimizer.
  """
  graphdef, state = nnx.split(Transformer(config, nnx.Rngs(seed)))

  def apply(params: dict, tokens_BT: jax.Array) -> jax.Array:
    return nnx.merge(graphdef, params)(tokens_BT)

  return apply, nnx.to_pure_dict(state)


def cast(params: Any, dtype: str) -> Any:
  """``params`` with every floating-point leaf in ``dtype`` (``"float32"``, ``"bfloat16"``).

  A bfloat16 model computes in bfloat16 (Flax promotes inputs to the parameters'
  dtype), keeps its normalisation statistics in float32 (Flax's default) and its
  loss in float32 (:func:`loss_fn`).
  """
  return jax.tree.map(
    lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params
  )


def param_shapes(config: ModelConfig) -> dict:
  """The params tree as ``jax.ShapeDtypeStruct`` leaves, without allocating them."""
  return jax.eval_shape(lambda: init(config, 0)[1])


def loss_fn(apply: Callable, params: dict, batch_BT1: jax.Array) -> jax.Array:
  """Mean next-byte cross entropy (nats) over a batch of ``T + 1`` byte windows.

  The softmax and the mean are taken in float32 whatever the parameter dtype: with
  bfloat16 parameters the logits are bfloat16, too coarse for a loss near 1 nat.
  """
  inputs_BT, targets_BT = batch_BT1[:, :-1], batch_BT1[:, 1:]
  logits_BTV = apply(params, inputs_BT).astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits_BTV, targets_BT).mean()


def _excluded(path) -> bool:
  names = {getattr(k, "key", getattr(k, "name", None)) for k in path}
  return bool(names & set(EXCLUDED_FROM_LOW_RANK))


def low_rank_labels(params: Any) -> Any:
  """``low_rank_labels`` for LoRDO: the blocks' 2-D kernels are low-rank, nothing else.

  Works on the params tree and on the ``optax.MaskedNode``-filled trees that
  ``optax.partition`` passes (a masked leaf has no ``ndim`` and is labelled False).
  """
  return jax.tree_util.tree_map_with_path(
    lambda path, x: getattr(x, "ndim", 0) == 2 and not _excluded(path),
    params,
    is_leaf=lambda x: isinstance(x, optax.MaskedNode),
  )


def low_rank_shapes(config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
  """``(path, shape)`` of every leaf :func:`low_rank_labels` marks low-rank."""
  shapes = param_shapes(config)
  labels = low_rank_labels(shapes)
  flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
  return [
    (jax.tree_util.keystr(path), x.shape)
    for (path, x), label in zip(flat, jax.tree.leaves(labels), strict=True)
    if label
  ]


def num_params(params: Any) -> int:
  """Number of scalars in ``params``."""
  return sum(int(x.size) for x in jax.tree.leaves(params))
