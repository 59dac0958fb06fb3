"""What the quick extension rows and the paper arm's options promise, on real steps of
their optimizers.

``tests/benchmark/test_benchmarks_quality.py`` runs those studies end to end with training
faked (their wiring); what only training shows is checked here, on the tiny LM at the
quick study's settings (24 steps, K = T = 8, warmup 8 then cosine from its one rate,
1e-2), each row's optimizer built as its run builds it (``train.make_optimizer`` of the
row's ``RunSpec``), on 2 simulated workers with batch 2 (the bytes per worker depend on
neither):

* the extension rows send what their options promise: int8 messages with 4 streamed
  fragments under half of plain LoRDO's bytes, and their largest step under a quarter
  of its largest; two-sided LoRDO fewer bytes than one-sided; TSR-Adam's projected
  cores fewer than low-rank DDP's projected coordinates; QSR's longer rounds fewer
  bytes than plain LoRDO (each compression and streaming alone against the plain run:
  ``tests/comm/test_compression.py``, ``tests/round/test_streaming.py``);
* with the paper protocol's options (its arm's ``--option`` flags, read as
  ``examples/main.py`` reads them) LoRDO still sends fewer bytes than low-rank DDP (its
  warm start, constant schedule and clipping send no message of their own; the shared
  phase's bytes are left out of the arm's: ``tests/integration/test_lm_warm_start.py``).

The quick fidelity rows' options reach their runs (``RunSpec.config()``:
``tests/benchmark/test_benchmarks_regime.py``; the optimizer factory:
``tests/integration/test_lm_paper_options.py``); whether they train better is what the
fidelity study measures (BENCHMARKS.md), not a test.
"""

import functools

import jax
import optax
from jax.sharding import PartitionSpec as P

import lordo_jax
from benchmarks.harness import lm_runs
from benchmarks.harness.variants import Variant
from benchmarks.paper import paper_protocol
from benchmarks.quality import extensions
from benchmarks.quality import quality
from tests.helpers import workers
from tests.helpers.lm_example import data
from tests.helpers.lm_example import main
from tests.helpers.lm_example import model
from tests.helpers.lm_example import train

M = 2  # Workers.
BATCH = 2  # Windows per worker per step.
STUDY = quality.QUICK
(LEARNING_RATE,) = STUDY.learning_rates  # The quick study's best rate of every method.
CONFIG = model.PRESETS[STUDY.preset]


def trained(spec: lm_runs.RunSpec) -> list[int]:
  """``spec``'s optimizer on the tiny LM, M workers: the bytes sent per worker after every
  step (cumulative). Trained once per method and config: two specs that differ only in
  their variant's name or description (an extension row's plain LoRDO and the quality
  study's) are one run."""
  return _trained(spec.variant.method, spec.config())


@functools.cache
def _trained(method: str, config: train.TrainConfig) -> list[int]:
  tx = train.make_optimizer(method, config)
  assert train.AXIS == workers.AXIS
  mesh = mesh_of_workers()

  def body(params, state, grads):
    params, state, grads = jax.tree.map(lambda x: x[0], (params, state, grads))
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    return jax.tree.map(lambda x: x[None], (params, state))

  # The step in two programs: the gradients (the model's, one program for every run)
  # and this optimizer's update, so each run compiles only its optimizer.
  update = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=P(workers.AXIS), out_specs=P(workers.AXIS))
  )
  gradients = worker_gradients(config.seed)
  dataset = lm_runs.dataset(M, CONFIG.seq_len, BATCH)
  batches = data.Batches(dataset, seq_len=CONFIG.seq_len, batch_size=BATCH, seed=config.seed)
  state = workers.shard(workers.stack(tx.init(initial(config.seed)[1]), M), mesh)
  stacked = workers.shard(workers.stack(initial(config.seed)[1], M), mesh)
  sent = []
  for _ in range(config.steps):
    grads = jax.block_until_ready(gradients(stacked, workers.shard(batches(), mesh)))
    stacked, state = update(stacked, state, grads)
    jax.block_until_ready((stacked, state))  # One multi-device program in flight at a time.
    sent.append(lordo_jax.communicated_bytes(state))
  return sent


@functools.cache
def mesh_of_workers():
  return jax.make_mesh((M,), (workers.AXIS,))


@functools.cache
def worker_gradients(seed: int):
  """Each worker's gradient of :func:`initial`'s model on its own batch, jitted once."""
  apply = initial(seed)[0]

  def body(params, batch):
    params, batch = jax.tree.map(lambda x: x[0], (params, batch))
    grads = jax.grad(functools.partial(model.loss_fn, apply))(params, batch)
    return jax.tree.map(lambda x: x[None], grads)

  return jax.jit(
    jax.shard_map(body, mesh=mesh_of_workers(), in_specs=P(workers.AXIS), out_specs=P(workers.AXIS))
  )


@functools.cache
def initial(seed: int):
  """The tiny LM's ``apply`` and initial params (one ``apply``: one gradient program)."""
  return model.init(CONFIG, seed)


def extension(name: str) -> list[int]:
  """The run of extension row ``name`` (quick study's settings, seed 0)."""
  (variant,) = [v for v, _ in extensions.ROWS if v.name == name]
  return trained(STUDY.spec(variant, LEARNING_RATE, 0))


def peak(sent: list[int]) -> int:
  """The most bytes one step sent, as :func:`extensions.peak_step_bytes` reads a run."""
  return extensions.peak_step_bytes({"result": {"bytes_sent": sent}})


def test_the_extension_rows_send_what_their_options_promise():
  bytes_of = {name: extension(name)[-1] for name in extensions.QUICK_ROWS}
  lordo, ours = extension("lordo"), extension(extensions.HEADLINE)
  # int8 sends the pseudo-gradient at a byte (plus a float32 scale per row), the
  # moments in bfloat16: under half of float32's bytes. Four streamed fragments cut the
  # largest message to under a quarter (measured: a sixth).
  assert 2 * ours[-1] < lordo[-1]
  assert 4 * peak(ours) < peak(lordo)
  # Two-sided: r x r moments instead of r x q; TSR-Adam's per-step cores undercut the
  # r x q coordinates of low-rank DDP (projected).
  assert bytes_of["lordo_two_sided"] < bytes_of["lordo"]
  assert bytes_of["tsr_adam_projected"] < bytes_of["low_rank_ddp_projected"]
  # QSR lengthens rounds as the rate decays: fewer syncs, fewer bytes.
  assert bytes_of["lordo_qsr"] < bytes_of["lordo"]
  assert 0 < bytes_of["lordo"] < bytes_of["low_rank_ddp"]


def test_the_paper_arms_options_keep_lordos_bytes_under_low_rank_ddps():
  flags = paper_protocol.ARMS["paper"]
  options = main.method_options([flags[i + 1] for i, f in enumerate(flags) if f == "--option"])
  sent = {}
  for method in ("lordo", "low_rank_ddp"):
    variant = Variant(f"{method}_paper", method, options[method])
    sent[method] = trained(STUDY.spec(variant, LEARNING_RATE, 0))[-1]
  assert 0 < sent["lordo"] < sent["low_rank_ddp"]
