r"""Train a byte-level transformer LM with LoRDO and its baselines on simulated workers.

    python3 examples/main.py                      # LoRDO, low-rank DDP, DDP, DiLoCo
    python3 examples/main.py --lr 2e-3            # every method at one learning rate
    python3 examples/main.py --methods lordo,ddp --steps 200 --workers 4
    python3 examples/main.py --text my_book.txt --preset base
    python3 examples/main.py --param-dtype bfloat16       # bf16 params, f32 moments
    python3 examples/main.py --methods lordo,diloco --workers 4 --fsdp 2 --offload
    python3 examples/main.py --methods lordo,diloco --overlap round --merge delayed
    python3 examples/main.py --checkpoint-dir ckpt --checkpoint-every 32
    python3 examples/main.py --checkpoint-dir ckpt --resume   # after a stop
    python3 examples/main.py --checkpoint-dir ckpt --resume --workers 4  # on what is left
    python3 examples/main.py --methods lordo --absent 6:2-9,7:2-9  # two workers away, back
    python3 examples/main.py --warm-start-steps 64 --option lordo.omega=0.97  # docs/FIDELITY.md

Every run trains the same model from the same initialisation on the same data, with
``--workers`` workers on a mesh of ``--devices`` simulated CPU devices, and logs the
validation loss and the bytes each worker all-reduced (read from the optimizer
state's ledger). At the end it prints a table and writes ``results.json``,
``val_loss_vs_step.png`` and ``val_loss_vs_bytes.png`` into ``--out``.

Each method trains at its own tuned peak learning rate (the best of the quality
study's sweep, ``lm.tuned.TUNED_LEARNING_RATES``) unless ``--lr`` sets one for
all. Next to what each method sent, the table shows the other side of the trade:
the bandwidth per worker at which the method keeps 90% of an accelerator's compute
busy when training GPT-2 small (124M) on 8 H100s, from
``benchmarks/communication/accelerator_model.py`` (read from ``lm/bandwidth_gpt2_small.json``).

Losses are in nats per byte; the unigram entropy of the text (the best loss of a
model that ignores context) is printed for reference.

With ``--fsdp N`` each worker shards its parameters and optimizer state N ways over
its devices (FSDP inside the worker; the mesh is workers x data x N), and with
``--offload`` the methods with an anchor keep it (and DiLoCo's outer momentum) in host
memory between syncs (``offload=True``); the results are those of ``--fsdp 1`` (to
float rounding) and of no offload (bit for bit).

With ``--overlap round`` (or a tau below ``--sync-every``) and ``--merge``, every method
built on a round averages each round's message while its workers go on (lordo_jax's
``overlap``, MATH.md §9); the table's "90% busy at" is then the overlapped one. The
default table's last row, ``lordo_int8_overlap``, is LoRDO with its pseudo-gradient in
int8 and a whole round in flight, merged eagerly with an outer SGD step of 0.7 (the best
of the outer optimizer study): the least bandwidth of any configuration, at a cost in
loss (docs/guides/overlap.md, "What it costs in quality").

With ``--checkpoint-dir`` each method saves checkpoints under ``DIR/<method>``;
``--resume`` continues every method that has one from its latest (a method without
one starts afresh), and the resumed run ends bit-identical to one that never stopped.
On another ``--workers`` the state is remapped (``lordo_jax.remap_workers``: the shared
state carried, the moments averaged, every worker on the synchronised parameters) and
the text split over the new workers; ``--resume-mid-round restart`` takes a checkpoint
saved mid-round. ``--absent`` marks workers away for rounds (``fault_tolerant=True``).

With ``--warm-start-steps S`` (the LoRDO paper's protocol, ``docs/FIDELITY.md``) the
first S steps are trained once with ``--warm-start-method`` (low-rank DDP), saved under
``DIR/warm_start/<method>`` (``DIR``: ``--checkpoint-dir``, else ``--out``), and every
method of ``--methods`` continues from that checkpoint: its parameters, data position,
bases, moments and error buffers (``examples/lm/warm_start.py``). ``--option
METHOD.KEY=VALUE`` gives a method's factory an option; ``--option warm_start.KEY=VALUE``
one of the warm-start phase's.
"""

import os

# The CPU LAPACK behind jnp.linalg.svd is OpenBLAS: with its default threading, eight
# simulated devices calling it at once on a few cores run 100x slower. Before NumPy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

DEFAULT_DEVICES = 8


class UsageError(ValueError):
  """A bad option; the message says what to change."""


def lm_module(name: str):
  """``lm.<name>``, imported as this file is run: as a script or in the package."""
  import importlib

  return importlib.import_module(f".lm.{name}" if __package__ else f"lm.{name}", __package__)


def parse_args(argv=None) -> argparse.Namespace:
  tuned = lm_module("tuned").TUNED_LEARNING_RATES
  parser = argparse.ArgumentParser(
    prog="examples/main.py",
    description=(
      "Train a small byte-level transformer LM with LoRDO and baselines from lordo_jax "
      "on simulated CPU workers; print a table and write results.json and plots."
    ),
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  add = parser.add_argument
  add(
    "--methods",
    default=None,
    help="comma-separated lordo_jax methods to train, among lordo, low_rank_ddp, ddp, "
    "diloco, local_adam, desloc, lordo_local_projection, lordo_global_projection_only "
    "and lordo_int8_overlap (LoRDO with an int8 pseudo-gradient, overlap='round' and an "
    "outer step of 0.7) "
    "(default: lordo,low_rank_ddp,ddp,diloco,lordo_int8_overlap, those the installed "
    "lordo_jax provides)",
  )
  add("--workers", type=int, default=8, help="simulated workers M; must divide --devices")
  add(
    "--devices",
    type=int,
    default=DEFAULT_DEVICES,
    help="simulated CPU devices; each worker gets devices/workers of them",
  )
  add(
    "--fsdp",
    type=int,
    default=1,
    help="N: shard each worker's parameters and optimizer state N ways over its devices "
    "(FSDP inside the worker; the mesh is workers x data x N, data = devices / (workers N)); "
    "must divide devices/workers",
  )
  add(
    "--offload",
    action="store_true",
    help="keep each method's anchor (and outer optimizer state) in host memory between "
    "syncs (lordo_jax's offload=True); for the methods with an anchor: lordo, diloco, "
    "local_adam, desloc, lordo_local_projection, lordo_global_projection_only",
  )
  add(
    "--overlap",
    type=overlap_value,
    default=None,
    help="average each round's message while the workers go on (lordo_jax's overlap): "
    "'round' (a whole round in flight, one chunk a step) or tau, an int below --sync-every "
    "(lands tau steps after its boundary); for the methods built on a round but desloc",
  )
  add(
    "--merge",
    choices=("eager", "delayed", "rebase", "streaming"),
    default=None,
    help="how a message in flight lands: eager (default), delayed, rebase or streaming "
    "with --overlap round; rebase (default) or streaming with an int --overlap",
  )
  add(
    "--rank",
    type=int,
    default=None,
    help="rank r of the low-rank methods (default: the model width / 4); must be "
    "smaller than the model width",
  )
  add(
    "--sync-every",
    type=int,
    default=16,
    help="K: local steps between synchronisations (lordo, diloco, local_adam, desloc)",
  )
  add(
    "--refresh-every",
    type=int,
    default=None,
    help="T: steps between basis refreshes of low_rank_ddp (default: --sync-every)",
  )
  add("--steps", type=int, default=256, help="optimizer steps per method")
  add("--seed", type=int, default=0, help="seed of the initialisation and the data order")
  add(
    "--preset",
    choices=("tiny", "small", "base"),
    default="small",
    help="model size: tiny (d=32, 1 layer; seconds), small (d=128, 2 layers), "
    "base (d=256, 4 layers; slow on CPU)",
  )
  add(
    "--lr",
    type=float,
    default=None,
    help="peak learning rate of every method (warmup, cosine decay to a tenth); default: "
    "each method at its tuned rate, the best of the quality study's sweep (BENCHMARKS.md): "
    + ", ".join(f"{m} {lr:g}" for m, lr in tuned.items()),
  )
  add(
    "--warmup",
    type=int,
    default=32,
    help="learning-rate warmup steps (32: the quality study's, where the rates were tuned)",
  )
  add(
    "--schedule",
    choices=("cosine", "constant"),
    default="cosine",
    help="the learning rate after the warmup: cosine decay to lr/10, or constant",
  )
  add(
    "--clip-norm",
    type=float,
    default=None,
    help="clip each worker's gradient to this global norm (default: no clipping)",
  )
  add("--weight-decay", type=float, default=0.0, help="decoupled weight decay")
  add("--batch", type=int, default=8, help="windows per worker per step")
  add("--eval-every", type=int, default=16, help="steps between validation evaluations")
  add("--eval-windows", type=int, default=64, help="validation windows per evaluation")
  add("--text", default=None, help="train on this text file instead of pydoc_data.topics")
  add(
    "--param-dtype",
    choices=("float32", "bfloat16"),
    default="float32",
    help="dtype of the parameters, gradients and activations; the optimizer's moments "
    "and projections stay float32",
  )
  add(
    "--checkpoint-dir",
    default=None,
    help="save checkpoints (params, whole optimizer state, data position, step) of "
    "each method under DIR/<method>",
  )
  add(
    "--checkpoint-every",
    type=int,
    default=0,
    help="steps between checkpoints (0: only at the end of the run)",
  )
  add(
    "--resume",
    action="store_true",
    help="continue each method from its latest checkpoint in --checkpoint-dir",
  )
  add(
    "--resume-mid-round",
    choices=("restart",),
    default=None,
    help="with --resume on another --workers than the checkpoint's, a checkpoint saved "
    "mid-round restarts its round from the synchronised parameters, losing the local "
    "steps since the last sync (default: refused; save every multiple of --sync-every)",
  )
  add(
    "--absent",
    type=absent_value,
    default=(),
    help="WORKER:FIRST-LAST[,...]: that worker leaves for rounds FIRST..LAST (counted "
    "from 1) and comes back; the methods are built fault tolerant (those with rounds)",
  )
  add(
    "--stop-after",
    type=int,
    default=None,
    help="stop each method after this step and checkpoint it (a time-limited job); "
    "continue later with --resume",
  )
  add(
    "--warm-start-steps",
    type=int,
    default=0,
    help="train the first S steps once with --warm-start-method, then every method from "
    "its checkpoint (bases, moments, error buffers carried over; 0: no warm start)",
  )
  add(
    "--warm-start-method",
    default="low_rank_ddp",
    help="the method of the shared warm-start phase",
  )
  add(
    "--warm-start-moments",
    choices=("keep", "reset"),
    default="keep",
    help="the moments at the switch: the warm-start phase's, or zeros (the authors' switch)",
  )
  add(
    "--option",
    action="append",
    default=[],
    metavar="METHOD.KEY=VALUE",
    help="an option of a method's lordo_jax factory, e.g. lordo.omega=0.97 or "
    "low_rank_ddp.transport=rotate (VALUE read as JSON, else a string); KEY lr_scale "
    "multiplies the method's learning rate; METHOD warm_start: an option of the "
    "--warm-start-method phase; repeatable",
  )
  add("--out", default="runs/lm", help="output directory for results.json and plots")
  add("--no-progress", action="store_true", help="no progress bars")
  return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
  """The checks that need no JAX; each failure is a UsageError saying what to change."""
  for name in ("workers", "devices", "fsdp", "sync_every", "refresh_every", "steps", "batch"):
    value = getattr(args, name)
    if value is not None and value < 1:
      option = f"--{name.replace('_', '-')}"
      raise UsageError(f"{option} {value} is not allowed; use {option} 1 or more.")
  if args.eval_every < 1 or args.eval_windows < 1:
    raise UsageError("--eval-every and --eval-windows must be positive; use 1 or more.")
  if args.clip_norm is not None and not args.clip_norm > 0:
    raise UsageError(f"--clip-norm {args.clip_norm} is not allowed; use a positive norm.")
  if args.lr is not None and not args.lr > 0:
    raise UsageError(f"--lr {args.lr} is not allowed; use a positive learning rate.")
  if args.workers > args.devices:
    raise UsageError(
      f"--workers {args.workers} is more than the {args.devices} simulated devices; "
      f"use --workers {args.devices} or fewer, or raise --devices."
    )
  if args.devices % args.workers:
    divisors = [d for d in range(1, args.devices + 1) if args.devices % d == 0]
    raise UsageError(
      f"--workers {args.workers} does not divide the {args.devices} simulated devices; "
      f"use one of {','.join(map(str, divisors))}, or set --devices to a multiple of "
      f"{args.workers}."
    )
  per_worker = args.devices // args.workers
  if per_worker % args.fsdp:
    divisors = [d for d in range(1, per_worker + 1) if per_worker % d == 0]
    raise UsageError(
      f"--fsdp {args.fsdp} does not divide each worker's {per_worker} devices (--devices / "
      f"--workers); use one of {','.join(map(str, divisors))}, or fewer --workers."
    )
  data = per_worker // args.fsdp
  if args.batch % data:
    raise UsageError(
      f"--batch {args.batch} is split over each worker's {data} data-parallel devices; use "
      f"a multiple of {data}."
    )
  if args.text is not None and not pathlib.Path(args.text).is_file():
    raise UsageError(f"--text {args.text}: no such file; give the path of a text file.")
  if args.checkpoint_every < 0:
    raise UsageError(
      f"--checkpoint-every {args.checkpoint_every} is not allowed; use 0 (only at the end) or more."
    )
  if args.stop_after is not None and args.stop_after < 1:
    raise UsageError(f"--stop-after {args.stop_after} is not allowed; use 1 or more.")
  if not 0 <= args.warm_start_steps < args.steps:
    raise UsageError(
      f"--warm-start-steps {args.warm_start_steps} is not between 0 and --steps "
      f"{args.steps}; use fewer, or more --steps."
    )
  method_options(args.option)
  if args.checkpoint_dir is None:
    for option, given in (
      ("--resume", args.resume),
      ("--checkpoint-every", args.checkpoint_every),
      ("--stop-after", args.stop_after is not None),
    ):
      if given:
        raise UsageError(f"{option} needs --checkpoint-dir; give one: --checkpoint-dir DIR.")


def main(argv=None) -> int:
  args = parse_args(argv)
  try:
    check_args(args)
  except UsageError as error:
    return fail(error)

  import jax

  jax.config.update("jax_num_cpu_devices", args.devices)

  if __package__:
    from .lm import checkpoints
    from .lm import data
    from .lm import model
    from .lm import optimizers
    from .lm import report
    from .lm import train
    from .lm import tuned
  else:
    from lm import checkpoints
    from lm import data
    from lm import model
    from lm import optimizers
    from lm import report
    from lm import train
    from lm import tuned

  model_config = model.PRESETS[args.preset]
  try:
    methods = resolve_methods(args.methods, optimizers)
    check_option_methods(args, methods)
    check_offload(args.offload, methods, train.offload_methods())
    check_overlap(args, methods, train.overlap_methods())
    check_absent(args, methods, train)
    rank = check_rank(args.rank, model_config, args.preset, model)
    raw, name = data.load_text(args.text)
    dataset = data.split(
      raw,
      num_workers=args.workers,
      seq_len=model_config.seq_len,
      batch_size=args.batch,
      name=name,
    )
    config = make_config(args, rank, train)
    warm_base = learning_rate_config(config, args.lr, args.warm_start_method, tuned)
    if args.warm_start_method not in train.offload_methods():  # No anchor to offload.
      warm_base = dataclasses.replace(warm_base, offload=False)
    if args.warm_start_method not in train.overlap_methods():  # No round to overlap.
      warm_base = dataclasses.replace(warm_base, overlap=None, merge=None)
    warm_config = warm_start_plan(args, warm_base, model_config, dataset, checkpoints)
    if warm_config is not None:
      config = dataclasses.replace(
        config,
        warm_start_from=warm_config.checkpoint_dir,
        warm_start_step=args.warm_start_steps,
        warm_start_moments=args.warm_start_moments,
      )
    configs = {m: learning_rate_config(config, args.lr, m, tuned) for m in methods}
    configs = resume_plan(args, configs, model_config, dataset, checkpoints)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
  except (UsageError, data.DataError, checkpoints.ResumeError) as error:
    return fail(error)
  except OSError as error:
    return fail(UsageError(f"--out {args.out}: cannot write there ({error}); use another --out."))

  _, params = model.init(model_config, args.seed)
  print(
    f"{dataset.name}: {dataset.num_bytes} bytes, unigram entropy "
    f"{dataset.unigram_entropy:.3f} nats/byte | model {args.preset}: "
    f"{model.num_params(params)} {args.param_dtype} params | {args.workers} worker(s) on "
    f"{args.devices} devices{layout_note(args)}, rank {rank}, K={args.sync_every}, "
    f"{args.steps} steps x {args.batch} x {model_config.seq_len} bytes per worker",
    flush=True,
  )
  start = time.perf_counter()
  warm = None
  if warm_config is not None:
    warm = train.train(
      args.warm_start_method, warm_config, model_config, dataset, progress=not args.no_progress
    )
    print(
      f"warm start: {args.warm_start_method} steps 1-{args.warm_start_steps}, validation loss "
      f"{warm.final_val_loss:.3f}, {warm.communicated_bytes / 2**20:.1f} MiB per worker "
      f"(not counted below); every method continues from {warm_config.checkpoint_dir}",
      flush=True,
    )
  results = []
  for method in methods:
    results.append(
      train.train(method, configs[method], model_config, dataset, progress=not args.no_progress)
    )
  total = time.perf_counter() - start

  meta = {
    "command": " ".join(sys.argv),
    "args": vars(args),
    "train_config": dataclasses.asdict(config),
    "learning_rates": {m: c.learning_rate for m, c in configs.items()},
    "model_config": dataclasses.asdict(model_config),
    "data": {
      "name": dataset.name,
      "bytes": dataset.num_bytes,
      "validation_bytes": len(dataset.validation),
      "unigram_entropy_nats": dataset.unigram_entropy,
      "unigram_entropy_bits": dataset.unigram_entropy / math.log(2),
    },
    "total_wall_time_s": total,
    "warm_start": None if warm is None else dataclasses.asdict(warm),
  }
  report.write_json(out / report.JSON_NAME, results, meta)
  title = f"{args.preset} byte LM on {pathlib.Path(dataset.name).name}, {args.workers} workers"
  plots = report.plot(out, results, dataset.unigram_entropy, title=title)
  print()
  learning_rates = {m: c.learning_rate for m, c in configs.items()}
  overlaps = {m: train.overlap_of(m, c) for m, c in configs.items()}
  bandwidth = tuned.bandwidth_table()
  print(report.table(results, dataset.unigram_entropy, learning_rates, bandwidth, overlaps))
  written = ", ".join(map(str, [out / report.JSON_NAME, *plots]))
  print(f"total wall time {total:.0f} s; wrote {written}")
  return 0


def check_absent(args, methods: list[str], train) -> None:
  """``--absent``: workers this run has, rounds in order, methods with rounds."""
  if not args.absent:
    return
  try:
    train.elastic.check_absent(args.absent, args.workers)
  except ValueError as error:
    raise UsageError(str(error)) from None
  without = [m for m in methods if m not in train.fault_tolerant_methods()]
  if without:
    raise UsageError(
      f"--absent: {','.join(without)}: no rounds to leave a worker out of; use "
      f"--methods among {','.join(train.fault_tolerant_methods())}."
    )


def absent_value(text: str) -> tuple[tuple[int, int, int], ...]:
  """``--absent``: ``WORKER:FIRST-LAST`` triples, comma-separated."""
  try:
    triples = []
    for part in text.split(","):
      worker, rounds = part.split(":")
      first, last = rounds.split("-")
      triples.append((int(worker), int(first), int(last)))
  except ValueError:
    raise argparse.ArgumentTypeError(
      f"{text!r} is not WORKER:FIRST-LAST[,...], e.g. 3:2-3 (worker 3 away for rounds 2 and 3)"
    ) from None
  return tuple(triples)


def overlap_value(text: str):
  """``--overlap``: ``round``, or an int (tau)."""
  if text == "round":
    return text
  try:
    return int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is neither 'round' nor an int") from None


def check_overlap(args, methods: list[str], overlap_methods: tuple[str, ...]) -> None:
  """``--overlap`` and ``--merge``: a delay the round can hold, and methods that take it."""
  if args.merge is not None and args.overlap is None:
    raise UsageError(f"--merge {args.merge} needs --overlap; add --overlap round or a tau.")
  if args.overlap is None:
    return
  if isinstance(args.overlap, int) and not 1 <= args.overlap < args.sync_every:
    raise UsageError(
      f"--overlap {args.overlap} is not between 1 and --sync-every {args.sync_every} - 1; "
      "use such a tau, or --overlap round."
    )
  refused = [m for m in methods if m not in overlap_methods]
  if refused:
    raise UsageError(
      f"--overlap: {','.join(refused)} {'has' if len(refused) == 1 else 'have'} no round to "
      f"overlap; use --overlap with --methods among {','.join(overlap_methods)}."
    )


def layout_note(args: argparse.Namespace) -> str:
  """How each worker holds its model, for the first line: nothing by default."""
  fsdp = f", each sharded {args.fsdp} ways (FSDP)" if args.fsdp > 1 else ""
  return fsdp + (", anchors in host memory" if args.offload else "")


def check_offload(offload: bool, methods: list[str], offload_methods: tuple[str, ...]) -> None:
  """With ``--offload`` every method trained must have an anchor to offload."""
  refused = [m for m in methods if m not in offload_methods]
  if offload and refused:
    raise UsageError(
      f"--offload: {','.join(refused)} {'has' if len(refused) == 1 else 'have'} no anchor to "
      f"keep in host memory; use --offload with --methods among {','.join(offload_methods)}."
    )


def method_options(specs: list[str]) -> dict[str, tuple]:
  """``{method: ((key, value), ...)}`` of the ``--option METHOD.KEY=VALUE`` given.

  VALUE is read as JSON (``true``, ``0.97``, ``"x"``), else taken as a string.
  """
  options: dict[str, dict] = {}
  for spec in specs:
    name, sep, text = spec.partition("=")
    method, dot, key = name.partition(".")
    if not (sep and dot and method and key):
      raise UsageError(
        f"--option {spec}: not METHOD.KEY=VALUE; use, e.g., --option lordo.omega=0.97."
      )
    try:
      value = json.loads(text)
    except json.JSONDecodeError:
      value = text
    options.setdefault(method, {})[key] = value
  return {method: tuple(sorted(kv.items())) for method, kv in options.items()}


def check_option_methods(args: argparse.Namespace, methods: list[str]) -> None:
  """Every ``--option`` names a method trained (or ``warm_start`` with a warm start)."""
  named = set(methods) | ({"warm_start"} if args.warm_start_steps else set())
  for method in method_options(args.option):
    if method not in named:
      raise UsageError(
        f"--option {method}.…: {method} is not trained; use one of {','.join(sorted(named))}."
      )


def warm_start_plan(args: argparse.Namespace, config, model_config, dataset, checkpoints):
  """The ``TrainConfig`` of the shared warm-start phase; None without one.

  It trains ``--warm-start-method`` with the ``--option warm_start.KEY=VALUE`` up to step
  ``--warm-start-steps`` of the whole run's schedule, checkpointed under
  ``DIR/warm_start/<method>``; a checkpoint already there (of the same settings, up to
  that step) is continued or reused, one of other settings is a ``ResumeError``.
  """
  if not args.warm_start_steps:
    return None
  method = args.warm_start_method
  directory = pathlib.Path(args.checkpoint_dir or args.out) / "warm_start" / method
  held = checkpoints.latest_step(directory)
  if held is not None and held > args.warm_start_steps:
    raise UsageError(
      f"--warm-start-steps {args.warm_start_steps}: {directory} already holds step {held}; "
      f"use --warm-start-steps {held}, or another --out or --checkpoint-dir."
    )
  warm_config = dataclasses.replace(
    config,
    optimizer_options=method_options(args.option).get("warm_start", ()),
    checkpoint_dir=str(directory),
    checkpoint_every=0,
    stop_after=args.warm_start_steps,
    resume=held is not None,
  )
  settings = checkpoints.settings(method, warm_config, model_config, dataset)
  checkpoints.check(directory, settings, resume=warm_config.resume)
  return warm_config


def make_config(args: argparse.Namespace, rank: int, train):
  """The ``TrainConfig`` the options describe (no checkpoint directory yet)."""
  return train.TrainConfig(
    steps=args.steps,
    num_workers=args.workers,
    batch_size=args.batch,
    learning_rate=args.lr or train.TrainConfig.learning_rate,
    warmup_steps=args.warmup,
    schedule=args.schedule,
    clip_norm=args.clip_norm,
    weight_decay=args.weight_decay,
    rank=rank,
    sync_every=args.sync_every,
    refresh_every=args.refresh_every or args.sync_every,
    seed=args.seed,
    eval_every=args.eval_every,
    eval_windows=args.eval_windows,
    param_dtype=args.param_dtype,
    checkpoint_every=args.checkpoint_every,
    stop_after=args.stop_after,
    fsdp=args.fsdp,
    offload=args.offload,
    overlap=args.overlap,
    merge=args.merge,
    absent=args.absent,
    resume_mid_round=args.resume_mid_round,
  )


def learning_rate_config(config, lr: float | None, method: str, tuned):
  """``config`` at ``lr``, or (``lr`` None) at ``method``'s tuned learning rate."""
  best = tuned.tuned_learning_rate(method) or config.learning_rate
  return dataclasses.replace(config, learning_rate=best if lr is None else lr)


def resume_plan(args, configs, model_config, dataset, checkpoints) -> dict:
  """Each method's ``TrainConfig`` of ``configs``, with its checkpoint directory and
  whether it resumes.

  Raises a UsageError or a ``checkpoints.ResumeError`` (each one line saying what to
  change) for ``--resume`` with no checkpoint of any method, a checkpoint written
  with other options, or checkpoints already there without ``--resume``.
  """
  options = method_options(args.option)
  if args.checkpoint_dir is None:
    return {
      m: dataclasses.replace(c, optimizer_options=options.get(m, ())) for m, c in configs.items()
    }
  methods = list(configs)
  root = pathlib.Path(args.checkpoint_dir)
  found = {m: checkpoints.latest_step(root / m) for m in methods}
  if args.resume and all(step is None for step in found.values()):
    held = []
    if root.is_dir():
      held = sorted(p.name for p in root.iterdir() if checkpoints.latest_step(p) is not None)
    hint = (
      f" (it holds {','.join(held)}; use --methods {','.join(held)})"
      if held
      else "; train without --resume first, or give the --checkpoint-dir of an earlier run"
    )
    raise UsageError(f"--resume: no checkpoint of {','.join(methods)} in {root}{hint}.")
  configs = dict(configs)
  for method, step in found.items():
    configs[method] = dataclasses.replace(
      configs[method],
      optimizer_options=options.get(method, ()),
      checkpoint_dir=str(root / method),
      resume=args.resume and step is not None,
    )
    settings = checkpoints.settings(method, configs[method], model_config, dataset)
    checkpoints.check(configs[method].checkpoint_dir, settings, resume=configs[method].resume)
  return configs


def resolve_methods(spec: str | None, optimizers) -> list[str]:
  """The methods to train, in order; a UsageError names the ones available."""
  available = optimizers.available_methods()
  if spec is None:
    return list(optimizers.default_methods())
  methods = [m.strip() for m in spec.split(",") if m.strip()]
  unknown = [m for m in methods if m not in available]
  if unknown or not methods:
    raise UsageError(
      f"--methods {spec}: {','.join(unknown) or 'none given'} not available; "
      f"choose among {','.join(available)}."
    )
  return methods


def check_rank(rank: int | None, config, preset: str, model) -> int:
  """The rank to use: given or width/4; a UsageError if no matrix is larger."""
  smallest = min(min(shape) for _, shape in model.low_rank_shapes(config))
  if rank is None:
    return max(1, config.d_model // 4)
  if not 1 <= rank < smallest:
    raise UsageError(
      f"--rank {rank} is not smaller than the model's matrices (preset {preset}: the "
      f"smallest low-rank matrix is {smallest} wide); use --rank between 1 and "
      f"{smallest - 1}, or a larger --preset."
    )
  return rank


def fail(error: Exception) -> int:
  print(f"examples/main.py: error: {error}", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main())
