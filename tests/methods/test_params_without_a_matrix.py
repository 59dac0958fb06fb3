"""The low-rank methods on parameters with no matrix train as their full-rank counterparts.

optax's optimizers take any pytree (``optax.contrib.galore`` sends a non-matrix to Adam).
With no 2-D leaf, ``lordo``, its ablations and ``low_rank_ddp`` warn once, naming the
full-rank method they then are, and train as it does: on 4 workers, a scalar and a
vector follow :func:`lordo_jax.local_adam` (LoRDO: its full-rank path is Adam with the
default ``full_rank_nu=1``, and it averages the parameters and both moments every
``sync_every`` steps), :func:`lordo_jax.diloco` with a plain-averaging outer step (the
local projection ablation keeps its moments local) and :func:`lordo_jax.ddp` (low-rank
DDP). Parameters whose 2-D leaves are all at or below the rank are still refused.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lordo_jax
from tests.helpers import workers

M = 4
AXIS = workers.AXIS
STEPS = 6
ADAM = {"b1": 0.8, "b2": 0.95, "weight_decay": 0.1}  # Not the defaults: both sides get them.
PARAMS = {"scale": jnp.asarray(1.5), "shift": jnp.linspace(-1.0, 1.0, 5)}


def loss(params, batch):
  x, y = batch
  return jnp.mean((params["scale"] * x + params["shift"] - y) ** 2)


def batches():
  """Each worker its own data, so that averaging parameters or moments matters."""
  keys = jax.random.split(jax.random.key(0), STEPS)
  xs = [jax.random.normal(k, (M, 5)) for k in keys]
  return [(x, 2.0 * x + jnp.arange(M, dtype=jnp.float32)[:, None]) for x in xs]


def final_params(tx):
  history, _ = workers.run(tx, loss, PARAMS, batches(), M)
  return jax.device_get(history[-1][0])


def messages(record, who):
  return [str(w.message) for w in record if str(w.message).startswith(f"{who}: the parameters")]


CASES = {
  "lordo": (
    lambda: lordo_jax.lordo(3e-2, rank=1, sync_every=2, axis_name=AXIS, **ADAM),
    lambda: lordo_jax.local_adam(3e-2, sync_every=2, axis_name=AXIS, **ADAM),
    "lordo",
    "lordo_jax.local_adam",
  ),
  "lordo_global_projection_only": (
    lambda: lordo_jax.lordo_global_projection_only(3e-2, rank=1, sync_every=2, axis_name=AXIS),
    lambda: lordo_jax.local_adam(3e-2, sync_every=2, axis_name=AXIS),
    "lordo_global_projection_only",  # lordo with omega = 1, in its own name.
    "lordo_jax.local_adam",
  ),
  "lordo_local_projection": (
    lambda: lordo_jax.lordo_local_projection(3e-2, rank=1, sync_every=2, axis_name=AXIS, **ADAM),
    lambda: lordo_jax.diloco(
      3e-2,
      sync_every=2,
      axis_name=AXIS,
      outer_learning_rate=1.0,
      outer_momentum=0.0,
      nesterov=False,
      **ADAM,
    ),
    "lordo_local_projection",
    "lordo_jax.diloco with outer_learning_rate=1.0 and outer_momentum=0.0",
  ),
  "low_rank_ddp": (
    lambda: lordo_jax.low_rank_ddp(3e-2, rank=1, refresh_every=2, axis_name=AXIS, **ADAM),
    lambda: lordo_jax.ddp(3e-2, axis_name=AXIS, **ADAM),
    "low_rank_ddp",
    "lordo_jax.ddp",
  ),
  "low_rank_ddp_projected": (
    lambda: lordo_jax.low_rank_ddp(
      3e-2, rank=1, axis_name=AXIS, communicate="projected", omega=1.0, **ADAM
    ),
    lambda: lordo_jax.ddp(3e-2, axis_name=AXIS, **ADAM),
    "low_rank_ddp",
    "lordo_jax.ddp",
  ),
}


@pytest.mark.parametrize("case", CASES)
def test_warns_once_and_trains_as_its_full_rank_counterpart(case):
  make, make_counterpart, who, counterpart = CASES[case]
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    got = final_params(make())  # init, then a traced update: the warning comes once.
  (message,) = messages(record, who)
  assert "no 2-D leaf" in message and counterpart in message, message
  want = final_params(make_counterpart())
  assert float(jnp.abs(want["scale"] - PARAMS["scale"]).min()) > 0.05  # It trained.
  for name in PARAMS:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_the_counterparts_differ_so_the_comparison_tells_them_apart():
  """Averaging the moments or keeping them local changes the run on this data."""
  averaged = final_params(CASES["lordo"][1]())
  local = final_params(CASES["lordo_local_projection"][1]())
  assert np.abs(averaged["shift"] - local["shift"]).max() > 1e-4


def test_the_warning_comes_once_over_eager_steps_and_a_second_init():
  """``update`` calls the label function at every step outside ``jit``, and ``init``
  may run again (a restart): one warning per optimizer all the same."""
  tx = lordo_jax.lordo(1e-2, rank=2, sync_every=2)
  grads = jax.tree.map(jnp.ones_like, PARAMS)
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    state = tx.init(PARAMS)
    for _ in range(3):
      _, state = tx.update(grads, state, PARAMS)
    tx.init(PARAMS)
  assert len(messages(record, "lordo")) == 1
  with pytest.warns(UserWarning, match="lordo: the parameters hold no 2-D leaf"):
    lordo_jax.lordo(1e-2, rank=2, sync_every=2).init(PARAMS)  # A new optimizer warns again.


@pytest.mark.parametrize("case", CASES)
def test_matrices_all_at_or_below_the_rank_are_still_refused(case):
  make = CASES[case][0]
  small = dict(PARAMS, w=jnp.ones((6, 1)))  # A 6 x 1 matrix: min(p, q) = 1 = rank.
  with pytest.raises(ValueError, match=r"rank=1 leaves no matrix low-rank.*6 x 1"):
    make().init(small)
