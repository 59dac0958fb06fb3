"""Worker groups that shard their model: every method on a workers x FSDP (x TP) mesh.

The worker step (the gradient, then the optimizer's step on it: two programs, the
first shared by every method) runs under ``jax.shard_map(..., axis_names={"workers"})``,
manual over the worker axis only; inside a worker its parameters stay sharded over the
``fsdp`` (and ``tp``) axes, with ``Explicit`` axis types (``jax.make_mesh``'s default)
and with ``Auto``. The result must be the 1-D run's (each worker's model whole on one
device) to 1e-5 relative, and the ledgers equal: the method's collectives run over
the worker axis only, whatever the sharding inside a worker.
"""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import lordo_jax
from tests.helpers import hlo
from tests.helpers import sharded_mlp
from tests.helpers.sharded_mlp import AXIS
from tests.helpers.sharded_mlp import FSDP_SPECS

pytestmark = pytest.mark.timeout(600, method="thread")

STEPS = 4  # Two syncs at K = 2, two refreshes of low-rank DDP at T = 3.
# LoRDO refreshed by one step of subspace iteration (the default takes two: the same
# products and Cholesky-QR over again, a second copy of them in the program).
subspace_iteration = functools.partial(
  lordo_jax.lordo,
  1e-2,
  rank=2,
  sync_every=2,
  axis_name=AXIS,
  projection="subspace_iteration",
  subspace_iterations=1,
)
METHODS = {
  "lordo_svd": lambda: lordo_jax.lordo(
    1e-2, rank=2, sync_every=2, axis_name=AXIS, projection="svd"
  ),
  "lordo_subspace_iteration": lambda: subspace_iteration(),
  "lordo_dct": lambda: lordo_jax.lordo(
    1e-2, rank=2, sync_every=2, axis_name=AXIS, projection="dct", error_feedback=True
  ),
  "lordo_two_sided": lambda: lordo_jax.lordo(
    1e-2, rank=2, sync_every=2, axis_name=AXIS, two_sided=True
  ),
  # The randomized SVDs with no power iteration (the default has one, which repeats the
  # sketch's products and orthonormalisation the other way round, at about twice the
  # program): FSDP's layout makes the one-sided sketches whole (their inner dimension is
  # the split one), the split-basis layout splits them by rows (Cholesky-QR); the
  # two-sided one sketches a matrix of each kind in either layout. A random first basis:
  # one from the gradient would run the syncs' refresh again (these methods have no exact
  # first basis) on the mean of the split first gradient, which the other LoRDO cases
  # above average; that second copy of the refresh was a third of the one-sided case's CPU.
  "lordo_randomized_svd": lambda: lordo_jax.lordo(
    1e-2,
    rank=2,
    sync_every=2,
    axis_name=AXIS,
    two_sided=True,
    projection="randomized_svd",
    power_iterations=0,
    init_projection="random",
  ),
  "lordo_one_sided_randomized_svd": lambda: lordo_jax.lordo(
    1e-2,
    rank=2,
    sync_every=2,
    axis_name=AXIS,
    projection="randomized_svd",
    power_iterations=0,
    init_projection="random",
  ),
  "ddp": lambda: lordo_jax.ddp(1e-2, axis_name=AXIS),
  "low_rank_ddp": lambda: lordo_jax.low_rank_ddp(1e-2, rank=2, refresh_every=3, axis_name=AXIS),
  "low_rank_ddp_projected": lambda: lordo_jax.low_rank_ddp(
    1e-2, rank=2, refresh_every=3, axis_name=AXIS, communicate="projected"
  ),
  "diloco": lambda: lordo_jax.diloco(1e-2, sync_every=2, axis_name=AXIS),
  # The variants of the sync below refresh their bases by SVD, the smallest program:
  # each worker refreshes from the synced mean (no message of its own), the same
  # whatever the sync; every refresh's sharded path runs in the cases above and in
  # the tensor-parallel, split-basis and products-only tests.
  "lordo_int8": lambda: lordo_jax.lordo(
    1e-2, rank=2, sync_every=2, axis_name=AXIS, projection="svd", compression="int8"
  ),
  "lordo_streaming": lambda: lordo_jax.lordo(
    1e-2, rank=2, sync_every=2, axis_name=AXIS, projection="svd", fragments=2
  ),
  "lordo_fault_tolerant": lambda: lordo_jax.lordo(
    1e-2, rank=2, sync_every=2, axis_name=AXIS, projection="svd", fault_tolerant=True
  ),
  # A message in flight: the first lands at step 4 (a round late) or 3 + 1 (tau = 1).
  "diloco_overlap_round": lambda: lordo_jax.diloco(
    1e-2, sync_every=2, axis_name=AXIS, overlap="round"
  ),
  "lordo_overlap_round_int8": lambda: lordo_jax.lordo(
    1e-2,
    rank=2,
    sync_every=2,
    axis_name=AXIS,
    projection="svd",
    overlap="round",
    compression="int8",
  ),
  "lordo_overlap_window": lambda: lordo_jax.lordo(
    1e-2, rank=2, sync_every=3, axis_name=AXIS, projection="svd", overlap=1
  ),
  # Two fragments frozen at steps 2 and 4 (K = 4); the first lands at step 3.
  "lordo_overlap_fragments": lambda: lordo_jax.lordo(
    1e-2, rank=2, sync_every=4, axis_name=AXIS, projection="svd", overlap=1, fragments=2
  ),
}
# int8 rounding is discontinuous: the 1e-7 differences of a sharded local step (sums
# split over the FSDP axis) can move a pseudo-gradient entry across a rounding boundary,
# by one quantum (1/127 of its row's largest entry, ~1e-4 here). Every other method: 1e-5.
TOLERANCE = {"lordo_int8": 1e-3, "lordo_overlap_round_int8": 1e-3}
# A refresh made of products with the split matrix: no first SVD, so no gather at all.
PRODUCTS_ONLY = {
  "lordo_subspace_iteration_random": lambda: subspace_iteration(init_projection="random"),
}
# Inside a worker: FSDP splits each matrix along one dimension; with a "tp" axis the
# MLP is tensor-parallel too (up's columns and down's rows, Megatron style).
# Each matrix split along the dimension its basis spans (rows on the left, columns on
# the right): subspace iteration's n x r factor stays split (shifted Cholesky-QR).
BASIS_SPLIT_SPECS = {
  "up": P(AXIS, None, "fsdp"),
  "down": P(AXIS, "fsdp", None),
  "bias": P(AXIS, "fsdp"),
}
TP_SPECS = {"up": P(AXIS, "fsdp", "tp"), "down": P(AXIS, "tp", "fsdp"), "bias": P(AXIS, "tp")}
LAYOUTS = {
  "whole": {name: P(AXIS) for name in sharded_mlp.params()},  # each worker on one device
  "fsdp": FSDP_SPECS,
  "basis_split": BASIS_SPLIT_SPECS,
  "tp": TP_SPECS,
}


def _batches(workers: int):
  """One batch per worker and step; each worker's data differ."""
  return [sharded_mlp.batch(t, workers) for t in range(STEPS)]


def _one_worker(fn):
  """``fn`` on one worker's slice of arguments stacked on a leading worker axis."""

  def body(*args):
    out = fn(*jax.tree.map(lambda a: a[0], args))
    return jax.tree.map(lambda a: a[None], out)

  return body


def _manual(mesh):
  return functools.partial(
    jax.shard_map, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS), axis_names={AXIS}
  )


@functools.cache
def _gradient(mesh):
  """The jitted gradient of every worker's loss: one program per mesh, for every method."""
  return jax.jit(_manual(mesh)(_one_worker(jax.grad(sharded_mlp.loss))))


@functools.cache
def programs(method: str, mesh, layout: str):
  """``method``'s jitted ``init`` and compiled optimizer step on ``mesh``, params placed
  by ``LAYOUTS[layout]``, and the step's entry parameters that hold its gradients and
  parameters (:func:`compiled_step`). The step, ``step(grads, state, params)``, is
  ``update`` then ``apply_updates``: compiled once, it trains (:func:`run`) and its HLO
  is what ``test_a_products_only_refresh_never_gathers_a_matrix`` and the overlap test
  read."""
  tx = {**METHODS, **PRODUCTS_ONLY}[method]()
  init = jax.jit(_manual(mesh)(_one_worker(tx.init)))
  return init, *compiled_step(_optimizer_step(tx), init, mesh, LAYOUTS[layout])


def _optimizer_step(tx, phase=None, optimizer: bool = True):
  """``update`` on given gradients (at ``overlap_phase=phase``), then ``apply_updates``;
  ``optimizer=False``: a step that returns its inputs."""
  extra = {} if phase is None else {"overlap_phase": phase}

  def step(grads, state, params):
    if not optimizer:
      return params, state
    updates, state = tx.update(grads, state, params, **extra)
    return optax.apply_updates(params, updates), state

  return step


def _placed(mesh, specs):
  """The initial params stacked over the mesh's workers, placed by ``specs``."""
  workers = mesh.shape[AXIS]
  return jax.tree.map(
    lambda a, spec: jax.device_put(jnp.stack([a] * workers), jax.NamedSharding(mesh, spec)),
    sharded_mlp.params(),
    specs,
  )


def run(method: str, mesh, layout: str, host: bool = True):
  """STEPS steps of ``method`` on ``mesh``; params placed by ``LAYOUTS[layout]``.

  Each step is the gradient, placed like the params, then the optimizer's step
  (:func:`programs`). The state is made by ``tx.init`` inside a ``shard_map`` like the
  step's, so that it follows the parameters' shardings. Returns (params, state): params
  on the host, or both as they lie on the devices (``host=False``).
  """
  specs = LAYOUTS[layout]
  init, step, _, _ = programs(method, mesh, layout)
  params = _placed(mesh, specs)
  state = init(params)
  shardings = jax.tree.map(lambda a: a.sharding, params)
  for batch in _batches(mesh.shape[AXIS]):
    batch = jax.device_put(batch, jax.NamedSharding(mesh, P(AXIS)))
    grads = jax.device_put(jax.block_until_ready(_gradient(mesh)(params, batch)), shardings)
    params, state = step(grads, state, params)
    jax.block_until_ready((params, state))
  for name, spec in specs.items():  # Still sharded as placed (trailing Nones aside).
    placed = tuple(params[name].sharding.spec) + (None,) * params[name].ndim
    assert placed[: params[name].ndim] == (tuple(spec) + (None,) * 3)[: params[name].ndim]
  return (jax.device_get(params) if host else params), state


@functools.cache
def unsharded_run(method: str, workers: int):
  """The reference: each worker's model whole on one device. Returns the params on the
  host, the state as it lies on the devices, and the ledgers."""
  mesh = jax.make_mesh((workers,), (AXIS,), devices=jax.devices()[:workers])
  params, state = run(method, mesh, "whole", host=False)
  ledgers = lordo_jax.communicated_bytes(state), lordo_jax.communicated_elements(state)
  return jax.device_get(params), state, *ledgers


@functools.cache
def fsdp_run(method: str, axis_type: AxisType = AxisType.Explicit):
  """``run`` on 4 workers x 2-way FSDP, both as they lie on the devices; the mesh."""
  mesh = jax.make_mesh((4, 2), (AXIS, "fsdp"), axis_types=(axis_type,) * 2)
  return mesh, *run(method, mesh, "fsdp", host=False)


def _assert_same_run(method, mesh, layout, ran=None):
  """``method`` on ``mesh`` (or its params and state ``ran`` there) against the reference."""
  params, state = ran or run(method, mesh, layout)
  params = jax.device_get(params)
  reference, _, nbytes, elements = unsharded_run(method, mesh.shape[AXIS])
  for name, initial in sharded_mlp.params().items():
    scale = np.max(np.abs(reference[name]))
    moved = np.max(np.abs(reference[name] - np.asarray(initial)[None]))
    assert moved > 1e-3 * scale, name  # The comparison below could fail.
    tolerance = TOLERANCE.get(method, 1e-5)
    np.testing.assert_allclose(params[name], reference[name], rtol=0, atol=tolerance * scale)
  assert lordo_jax.communicated_bytes(state) == nbytes > 0
  assert lordo_jax.communicated_elements(state) == elements


# Every method runs under Explicit axes. Under Auto axes (no sharding in the arrays'
# types, so the library reads none) one method of each way a sync handles a split
# leaf: a split one-sided basis, a compressed mean (gathered in the group), and a
# message in flight with fragments (the anchor's and the chunks' buffers). The
# tensor-parallel and split-basis tests below run two-sided bases, the projected mean's
# basis and subspace iteration under Auto too.
AUTO_METHODS = ("lordo_svd", "lordo_int8", "lordo_overlap_fragments")


@pytest.mark.parametrize(
  "method, axis_type",
  [(m, AxisType.Explicit) for m in METHODS] + [(m, AxisType.Auto) for m in AUTO_METHODS],
  ids=[f"{m}-explicit" for m in METHODS] + [f"{m}-auto" for m in AUTO_METHODS],
)
def test_four_workers_times_two_way_fsdp_match_the_unsharded_run(method, axis_type):
  mesh, params, state = fsdp_run(method, axis_type)
  _assert_same_run(method, mesh, "fsdp", (params, state))


@pytest.mark.parametrize(
  "method, axis_type",
  [
    # Subspace iteration's first basis is an exact SVD (``bases/subspace_iteration.py``),
    # the SVD refresh's: this case runs both on the tensor-parallel matrices.
    ("lordo_subspace_iteration", AxisType.Explicit),
    ("lordo_two_sided", AxisType.Auto),
    ("low_rank_ddp", AxisType.Auto),
    ("diloco", AxisType.Explicit),
  ],
  ids=lambda x: x.name.lower() if isinstance(x, AxisType) else x,
)
def test_two_workers_times_fsdp_times_tensor_parallel_match_the_unsharded_run(method, axis_type):
  mesh = jax.make_mesh((2, 2, 2), (AXIS, "fsdp", "tp"), axis_types=(axis_type,) * 3)
  _assert_same_run(method, mesh, "tp")


def _bytes_on(device, tree, keep=lambda path, leaf: True) -> int:
  """Bytes of the shards of ``tree``'s leaves that ``device`` holds (those ``keep`` picks)."""
  total = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    if keep(jax.tree_util.keystr(path), leaf):
      total += sum(s.data.nbytes for s in leaf.addressable_shards if s.device == device)
  return total


def _small(path: str, leaf) -> bool:
  """A leaf of at most 8 numbers a worker (counters, flags, DCT frequencies)."""
  return leaf.size <= 8 * leaf.shape[0]


@pytest.mark.parametrize("method", ["lordo_dct", "low_rank_ddp", "diloco"])
def test_the_state_of_a_sharded_parameter_is_sharded_like_it(method):
  """Per device, the state is 1/F of a whole worker's, but for its scalars.

  Measured from the arrays' shards after the run: the anchor, the error buffers and
  the full-rank moments split like their parameter, the low-rank moments along the
  matrix's kept dimension (the columns on the left, the rows on the right), and the
  ``n x r`` bases along their rows, over the axis their matrix is split on.
  """
  fsdp = 2
  mesh, _, state = fsdp_run(method)  # the runs the tests above compare
  _, whole, _, _ = unsharded_run(method, 4)
  device, whole_device = mesh.devices.flat[0], jax.devices()[0]
  sharded, unsharded = _bytes_on(device, state), _bytes_on(whole_device, whole)
  small = _bytes_on(whole_device, whole, _small)
  assert unsharded - small > small  # Most of the state is in the big leaves.
  assert sharded <= (unsharded - small) / fsdp + small, (sharded, unsharded, small)


@pytest.mark.parametrize(
  "method, axis_type",
  [
    ("lordo_subspace_iteration", AxisType.Auto),
    ("lordo_subspace_iteration_random", AxisType.Explicit),
  ],
  ids=lambda x: x.name.lower() if isinstance(x, AxisType) else x,
)
def test_subspace_iteration_on_a_split_basis_dimension_matches_the_unsharded_run(method, axis_type):
  """The n x r factor stays split by rows: shifted Cholesky-QR instead of a gathered QR.
  The ``Explicit`` case is the program whose HLO
  ``test_a_products_only_refresh_never_gathers_a_matrix`` reads (one compile for both)."""
  mesh = jax.make_mesh((4, 2), (AXIS, "fsdp"), axis_types=(axis_type,) * 2)
  _assert_same_run(method, mesh, "basis_split")


def test_one_sided_randomized_svd_on_a_split_basis_dimension_matches_the_unsharded_run():
  """The sketches ``X Omega`` (``n x l``) split by rows: shifted Cholesky-QR instead of a
  gathered QR, and only the ``l x q`` core made whole for its SVD. ``Explicit`` axes
  only: with ``Auto`` the program is the unsplit one (the compiler places the data),
  which the FSDP test runs."""
  mesh = jax.make_mesh((4, 2), (AXIS, "fsdp"))
  _assert_same_run("lordo_one_sided_randomized_svd", mesh, "basis_split")


def full_matrix_gathers(hlo: str, shapes) -> list[str]:
  """The all-gathers in ``hlo`` whose result has as many elements as a ``p x q`` matrix."""
  sizes = {p * q for p, q in shapes}
  found = []
  for line in hlo.splitlines():
    match = re.search(r"= \w+\[([0-9,]*)\]\S* all-gather(-start)?\(", line)
    if match and math.prod(int(d) for d in match.group(1).split(",") if d) in sizes:
      found.append(line.strip()[:160])
  return found


def test_the_gather_finder_sees_a_gather():
  line = "  %all-gather.1 = f32[16,24]{1,0} all-gather(f32[16,12]{1,0} %x), dimensions={1}"
  assert full_matrix_gathers(line, [(16, 24)]) and not full_matrix_gathers(line, [(8, 8)])


def compiled_step(step, init, mesh, specs):
  """The worker ``step`` (``(grads, state, params)``, the gradients placed like the
  params) jitted on ``mesh`` and compiled, the state made by the jitted ``init``; its HLO;
  and its entry parameters that hold the step's gradients and parameters.

  With ``Auto`` axes the compiler picks the layout of the state the step returns, which
  need not be ``init``'s: the step would be compiled again for the state it returns.
  There the state comes out laid out as it came in (``out_shardings``; a layout, the
  same numbers), so that one program runs every step. The params' layout stays the
  compiler's (:func:`run` checks it)."""
  params = _placed(mesh, specs)
  state = init(params)
  out_shardings = None
  if AxisType.Auto in mesh.axis_types:
    out_shardings = (None, jax.tree.map(lambda a: a.sharding, state))
  step = jax.jit(_manual(mesh)(_one_worker(step)), out_shardings=out_shardings)
  compiled = step.lower(params, state, params).compile()
  n_params, n_state = len(jax.tree.leaves(params)), len(jax.tree.leaves(state))
  computed = set(range(n_params)) | set(range(n_params + n_state, 2 * n_params + n_state))
  return compiled, compiled.as_text(), computed


def compiled_optimizer_step(tx, mesh, specs, *, phase=None, optimizer: bool = True):
  """:func:`compiled_step`'s HLO and entry parameters of ``tx`` alone on ``mesh``
  (``update`` at ``overlap_phase=phase``, then ``apply_updates``; ``optimizer=False``: a
  step that returns its inputs, to see what the ``shard_map`` boundary itself adds)."""
  init = jax.jit(_manual(mesh)(_one_worker(tx.init)))
  return compiled_step(_optimizer_step(tx, phase, optimizer), init, mesh, specs)[1:]


# The products-only refreshes each layout's test reads. A two-sided basis spans both
# dimensions of its matrix, and its range finder sketches every matrix on the left: the
# matrix split by rows gives a split sketch (Cholesky-QR), the one split by columns a
# whole sketch and a split core. FSDP splits ``up`` by rows and ``down`` by columns, the
# split-basis layout the other way round: the same paths in both, read on FSDP's.
PRODUCTS_ONLY_READ = {
  "fsdp": (
    "lordo_subspace_iteration_random",
    "lordo_one_sided_randomized_svd",
    "lordo_randomized_svd",
  ),
  "basis_split": ("lordo_subspace_iteration_random", "lordo_one_sided_randomized_svd"),
}


@pytest.mark.parametrize("layout", ["fsdp", "basis_split"])
def test_a_products_only_refresh_never_gathers_a_matrix(layout):
  """The compiled optimizer step (local and sync branches) of subspace iteration and
  of the one- and two-sided randomized SVD adds no all-gather of a p x q matrix to
  those of a step that does nothing (JAX 0.10's partially manual ``shard_map``
  gathers every split input at its boundary; JAX 0.12 does not); the SVD refresh
  does add some (the check can fail). The programs are those the runs above train
  with (:func:`programs`, compiled once), on ``Explicit`` axes; the two-sided one on
  the FSDP layout only (:data:`PRODUCTS_ONLY_READ`)."""
  mesh = jax.make_mesh((4, 2), (AXIS, "fsdp"))
  shapes = [a.shape for a in sharded_mlp.params().values() if a.ndim == 2]

  def gathers(method):
    return full_matrix_gathers(programs(method, mesh, layout)[2], shapes)

  boundary = full_matrix_gathers(
    compiled_optimizer_step(METHODS["ddp"](), mesh, LAYOUTS[layout], optimizer=False)[0], shapes
  )
  products = {method: gathers(method) for method in PRODUCTS_ONLY_READ[layout]}
  svd = gathers("lordo_svd")
  assert len(boundary) < len(svd), (boundary, svd)
  for method, found in products.items():
    assert len(found) <= len(boundary), (method, found, boundary)


@pytest.mark.parametrize(
  "method", ["diloco_overlap_round", "lordo_overlap_window", "lordo_overlap_fragments"]
)
def test_the_message_in_flight_is_split_over_the_group_like_the_parameters(method):
  """Each device holds 1/F of the frozen message and of its means (their columns split
  over ``fsdp``), so overlap keeps FSDP's memory saving."""
  mesh, _, state = fsdp_run(method)  # the run the test above compares
  for buffer in jax.tree.leaves(state.in_flight[:2]):  # each part's
    assert tuple(buffer.sharding.spec)[:3] == (AXIS, None, ("fsdp",)) or tuple(
      buffer.sharding.spec
    )[:3] == (AXIS, None, "fsdp")
    device = mesh.devices.flat[0]
    assert _bytes_on(device, buffer) * 4 * 2 == buffer.nbytes


WORKER_GROUPS = "{{0,2,4,6},{1,3,5,7}}"  # the worker axis of a (4, 2) mesh of devices 0..7


# The control of each case: the same kind of method without overlap (its sync in a
# conditional), a program the FSDP test trains on the same axis types (compiled once).
CONTROLS = {
  "diloco_overlap_round": "diloco",
  "lordo_overlap_round_random": "lordo_svd",
  "lordo_window": "lordo_svd",
  "lordo_window_fragments": "lordo_streaming",
}


@pytest.mark.parametrize(
  "method, phase, axis_type",
  [
    ("diloco_overlap_round", None, AxisType.Explicit),
    ("lordo_overlap_round_random", None, AxisType.Auto),
    ("lordo_window", "send", AxisType.Auto),
    ("lordo_window_fragments", "send", AxisType.Explicit),
  ],
  ids=lambda x: x.name.lower() if isinstance(x, AxisType) else x,
)
def test_on_four_workers_times_fsdp_the_chunk_can_overlap_the_step(method, phase, axis_type):
  """The compiled step of 4 workers x 2-way FSDP: every collective over the workers is
  at the top level and reads only the state carried in (``tests/helpers/hlo.py``); a
  method of the same kind without overlap (its sync in a conditional: :data:`CONTROLS`)
  is not, the control. DiLoCo's overlapped program and every control are those of
  :data:`METHODS` that the FSDP test trains (compiled once)."""
  # A random first basis (no mean of the first gradient, a sync of its own), refreshed
  # by SVD: each worker's own computation, no collective over the workers.
  lordo = functools.partial(
    lordo_jax.lordo, 1e-2, rank=2, projection="svd", init_projection="random"
  )
  build = {  # diloco_overlap_round: METHODS's
    "lordo_overlap_round_random": functools.partial(lordo, sync_every=2),
    "lordo_window": functools.partial(lordo, sync_every=3),
    "lordo_window_fragments": functools.partial(lordo, sync_every=6, fragments=2),
  }.get(method)
  overlap = {"lordo_window": 2, "lordo_window_fragments": 2}.get(method, "round")
  mesh = jax.make_mesh((4, 2), (AXIS, "fsdp"), axis_types=(axis_type,) * 2)
  if method in METHODS:  # diloco(1e-2, sync_every=2, ...) with overlap="round"
    assert phase is None and axis_type == AxisType.Explicit
    text, computed = programs(method, mesh, "fsdp")[2:]
  else:
    text, computed = compiled_optimizer_step(
      build(axis_name=AXIS, overlap=overlap), mesh, FSDP_SPECS, phase=phase
    )
  # Over the worker axis only: the model's own collectives inside a group (its split
  # sums, the boundary's gathers) read this step's parameters, as in any FSDP step.
  assert hlo.overlappable(text, computed, groups=WORKER_GROUPS)
  blocking, computed = programs(CONTROLS[method], mesh, "fsdp")[2:]
  assert not hlo.overlappable(blocking, computed, groups=WORKER_GROUPS)
