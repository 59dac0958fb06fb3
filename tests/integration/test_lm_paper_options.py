"""The LM job's options for the LoRDO authors' protocol (``docs/FIDELITY.md`` points 9, 11).

* ``--schedule constant``: linear warmup to the peak, then the peak to the end;
* ``--option METHOD.lr_scale=c``: the method's learning rate times c, exactly;
* ``--clip-norm c``: each worker's gradient clipped to global norm c before anything
  else (checked through low-rank DDP's error buffer, which is linear in the gradient
  where Adam's direction is not);
* ``--option METHOD.KEY=VALUE`` reaches the library's variants of the authors' code
  (``full_rank_numerator``, ``qh_nu``, ``full_rank_nu``, ``low_rank_term``,
  ``side=galore_std``; their maths is checked against the NumPy reference in
  ``test_reference.py`` and ``test_reference_low_rank_ddp.py``).
"""

import dataclasses
import functools
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lordo_jax

pytestmark = pytest.mark.timeout(120, method="thread")

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))
import main  # noqa: E402
from lm import model  # noqa: E402
from lm import optimizers  # noqa: E402
from lm import train  # noqa: E402

sys.path.remove(str(EXAMPLES))

M = 2
CONFIG = train.TrainConfig(steps=16, num_workers=M, learning_rate=1e-2, warmup_steps=4, rank=4)


def test_constant_schedule_after_the_warmup():
  constant = optimizers.schedule(1.0, 100, 10, "constant")
  assert [float(constant(t)) for t in (0, 5, 10, 50, 99)] == [0.0, 0.5, 1.0, 1.0, 1.0]
  cosine = optimizers.schedule(1.0, 100, 10)
  assert float(cosine(10)) == 1.0 and abs(float(cosine(100)) - 0.1) < 1e-6
  with pytest.raises(ValueError, match="use one of cosine, constant"):
    optimizers.schedule(1.0, 100, 10, "linear")


@functools.cache
def one_step_program(method, config):
  """``(step, sharding, state, params)`` of ``method`` built from ``config`` (a frozen
  ``TrainConfig``): ``step(grads, state, params) -> (updates, state)``, one update of M
  workers on a mesh of M workers (each worker's slice on its ``sharding``), jitted once
  and reused by every test that takes this (method, config); ``state`` and ``params``
  are the workers' initial ones, placed."""
  _, params = model.init(model.PRESETS["tiny"], 0)
  tx = train.make_optimizer(method, config)
  state = train.stack(tx.init(params), M)
  worker = P(train.AXIS)
  squeeze = lambda t: jax.tree.map(lambda x: x[0], t)  # noqa: E731
  expand = lambda t: jax.tree.map(lambda x: x[None], t)  # noqa: E731

  def body(grads, state, params):
    grads, state, params = squeeze(grads), squeeze(state), squeeze(params)
    return expand(tx.update(grads, state, params))

  mesh = train.make_mesh(M)
  sharding = NamedSharding(mesh, worker)
  state, params = jax.device_put((state, train.stack(params, M)), sharding)
  update = jax.shard_map(body, mesh=mesh, in_specs=worker, out_specs=worker)
  return jax.jit(update), sharding, state, params


def one_step(method, config, grads_mw):
  """``(updates, state)`` of M workers' second step on ``grads_mw``, a mesh of M workers:
  the same program (:func:`one_step_program`) run twice, as the warmup's first rate is 0.
  Each run is waited for before the next starts (collectives of two in flight at once
  can deadlock on the CPU client)."""
  update, sharding, state, params = one_step_program(method, config)
  grads_mw = jax.device_put(grads_mw, sharding)
  _, state = jax.block_until_ready(update(grads_mw, state, params))
  return jax.block_until_ready(update(grads_mw, state, params))


@functools.cache
def gradients(scale):
  """Each worker's own random gradient, of global norm far above 1 for a large scale."""
  _, params = model.init(model.PRESETS["tiny"], 0)
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(0), len(leaves))
  noise = [scale * jax.random.normal(k, (M, *x.shape)) for k, x in zip(keys, leaves, strict=True)]
  return jax.tree.unflatten(treedef, noise)


def test_lr_scale_multiplies_the_update():
  grads = gradients(1.0)
  full, _ = one_step("ddp", CONFIG, grads)
  half, _ = one_step(
    "ddp", dataclasses.replace(CONFIG, optimizer_options=(("lr_scale", 0.5),)), grads
  )
  for a, b in zip(jax.tree.leaves(half), jax.tree.leaves(full), strict=True):
    np.testing.assert_array_equal(a, 0.5 * b)
    assert np.any(b)


def test_clip_norm_clips_each_worker_gradient_first():
  grads = gradients(100.0)
  clip = 0.5
  # The fidelity test's low-rank DDP options (main.method_options sorts them): the
  # unclipped run's program is its.
  options = (("error_feedback", True), ("omega", 0.9))
  clipped_config = dataclasses.replace(CONFIG, clip_norm=clip, optimizer_options=options)
  plain_config = dataclasses.replace(CONFIG, optimizer_options=options)
  _, with_clip = one_step("low_rank_ddp", clipped_config, grads)
  by_hand = jax.vmap(lambda g: optax.clip_by_global_norm(clip).update(g, optax.EmptyState())[0])
  _, on_clipped = one_step("low_rank_ddp", plain_config, by_hand(grads))
  _, unclipped = one_step("low_rank_ddp", plain_config, grads)
  errors = lambda state: [np.asarray(s.error) for s in matrices(state)]  # noqa: E731
  assert len(errors(with_clip)) == len(model.low_rank_shapes(model.PRESETS["tiny"]))
  for a, b, c in zip(errors(with_clip), errors(on_clipped), errors(unclipped), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-6)  # fused in the step or not
    assert np.abs(c).max() > 10 * np.abs(a).max()  # the raw gradient's buffer is larger


FIDELITY_OPTIONS = [
  "full_rank_numerator=error_fed",
  "qh_nu=0.94",
  "full_rank_nu=0.97",
  "low_rank_term=momentum",
  "side=galore_std",
]


@pytest.mark.parametrize("method", ["lordo", "low_rank_ddp"])
def test_the_fidelity_options_reach_the_factory(method):
  specs = [f"{method}.error_feedback=true", f"{method}.omega=0.9"]
  base = main.method_options(specs)[method]
  given = main.method_options(specs + [f"{method}.{o}" for o in FIDELITY_OPTIONS])[method]
  assert dict(given)["qh_nu"] == 0.94 and dict(given)["side"] == "galore_std"
  grads = gradients(1.0)
  plain, plain_state = one_step(method, dataclasses.replace(CONFIG, optimizer_options=base), grads)
  varied, state = one_step(method, dataclasses.replace(CONFIG, optimizer_options=given), grads)
  pairs = zip(jax.tree.leaves(varied), jax.tree.leaves(plain), strict=True)
  gap = max(float(np.max(np.abs(a - b))) for a, b in pairs)
  assert gap > 1e-3
  # galore_std: the MLP's up kernel (d x hidden, projected on the right by "auto") keeps
  # its moments on the larger side, r x hidden, where "auto" keeps them d x r.
  preset = model.PRESETS["tiny"]
  d, hidden = preset.d_model, preset.mlp_ratio * preset.d_model
  shapes = lambda s: {np.shape(m.mu)[1:] for m in matrices(s)}  # noqa: E731
  assert (d, CONFIG.rank) in shapes(plain_state) and (d, CONFIG.rank) not in shapes(state)
  assert (CONFIG.rank, hidden) in shapes(state)
  wrong = dataclasses.replace(CONFIG, optimizer_options=(("full_rank_numerator", "error_fed"),))
  with pytest.raises(ValueError, match="Set error_feedback=True"):
    train.make_optimizer(method, wrong)


def matrices(state):
  """Every low-rank matrix's state in ``state``: per matrix, read from the stacks each
  :class:`lordo_jax.GroupedMoments` keeps per shape group."""
  is_grouped = lambda x: isinstance(x, lordo_jax.GroupedMoments)  # noqa: E731
  grouped = [x for x in jax.tree.leaves(state, is_leaf=is_grouped) if is_grouped(x)]
  return [matrix for moments in grouped for matrix in moments.listed()]


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_an_outer_rate_and_momentum_build_lordos_outer_optimizer(momentum):
  """``outer_learning_rate`` / ``outer_momentum`` (DiLoCo's keywords, the outer optimizer
  study's options) give a factory that takes only ``outer_optimizer`` Nesterov SGD."""
  params = {"w": jnp.linspace(-1.0, 1.0, 48).reshape(8, 6)}
  grads = {"w": jnp.cos(jnp.arange(48.0)).reshape(8, 6)}
  common = dict(learning_rate=1e-2, axis_name=None, rank=2, sync_every=2, refresh_every=2)

  def two_steps(tx):
    """The parameters after two steps (a round), one jitted program."""

    @jax.jit
    def run(params):
      state, p = tx.init(params), params
      for _ in range(2):
        updates, state = tx.update(grads, state, p)
        p = optax.apply_updates(p, updates)
      return p["w"]

    return np.asarray(run(params))

  given = optimizers.get_optimizer(
    "lordo", **common, extra_options={"outer_learning_rate": 0.5, "outer_momentum": momentum}
  )
  outer = optax.sgd(0.5, momentum=momentum or None, nesterov=bool(momentum))
  direct = lordo_jax.lordo(1e-2, rank=2, sync_every=2, outer_optimizer=outer)
  default = optimizers.get_optimizer("lordo", **common)
  after = two_steps(given)
  np.testing.assert_array_equal(after, two_steps(direct))
  assert np.max(np.abs(after - two_steps(default))) > 1e-4
