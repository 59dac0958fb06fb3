"""The jax, optax, flax and orbax names the pages link to, and their inventories.

Sphinx's intersphinx links a name to another project's docs through that project's
``objects.inv``, which the build would download; the site is built offline, so this
file holds the part of each inventory the pages use, and :func:`write_inventories`
writes them as ``objects.inv`` files (format 2) for ``intersphinx_mapping``. Each page
is where the project's own Sphinx sources put the object (its ``autosummary`` page, or
the ``autoclass`` page of its module), read from their repositories in November 2026.
"""

import os
import pathlib
import zlib

# project -> (its docs, {name as the pages write it: (full name, page)}).
PROJECTS = {
  "jax": (
    "https://docs.jax.dev/en/latest/",
    {
      name: (name, f"_autosummary/{name}.html")
      for name in (
        "jax.Array",
        "jax.ShapeDtypeStruct",
        "jax.block_until_ready",
        "jax.device_get",
        "jax.device_put",
        "jax.devices",
        "jax.distributed.initialize",
        "jax.eval_shape",
        "jax.experimental.multihost_utils.process_allgather",
        "jax.jit",
        "jax.lax.pmean",
        "jax.make_array_from_callback",
        "jax.make_mesh",
        "jax.pmap",
        "jax.shard_map",
      )
    }
    | {"jax.stages.Compiled": ("jax.stages.Compiled", "jax.stages.html")},
  ),
  "optax": (
    "https://optax.readthedocs.io/en/latest/",
    {
      name: (full, f"api/generated/{full}.html")
      for name, full in {
        "optax.GradientTransformation": "optax.GradientTransformation",
        "optax.GradientTransformationExtraArgs": "optax.GradientTransformationExtraArgs",
        "optax.ScaleByAdamState": "optax.ScaleByAdamState",
        "optax.adamw": "optax.adamw",
        "optax.apply_if_finite": "optax.apply_if_finite",
        "optax.apply_updates": "optax.apply_updates",
        "optax.chain": "optax.chain",
        "optax.clip_by_global_norm": "optax.clip_by_global_norm",
        "optax.contrib.galore": "optax.contrib.galore",
        "optax.contrib.muon": "optax.contrib.muon",
        "optax.inject_hyperparams": "optax.schedules.inject_hyperparams",
        "optax.masked": "optax.masked",
        "optax.partition": "optax.partition",
        "optax.scale": "optax.scale",
        "optax.scale_by_adam": "optax.scale_by_adam",
        "optax.sgd": "optax.sgd",
        "optax.tree_utils.tree_get": "optax.tree_utils.tree_get",
      }.items()
    },
  ),
  "flax": (
    "https://flax.readthedocs.io/en/latest/",
    {
      "nnx.Optimizer": ("flax.nnx.Optimizer", "api_reference/flax.nnx/training/optimizer.html"),
      "nnx.State": ("flax.nnx.State", "api_reference/flax.nnx/state.html"),
      "nnx.merge": ("flax.nnx.merge", "api_reference/flax.nnx/graph.html"),
      "nnx.scan": ("flax.nnx.scan", "api_reference/flax.nnx/transforms.html"),
      "nnx.split": ("flax.nnx.split", "api_reference/flax.nnx/graph.html"),
      "nnx.state": ("flax.nnx.state", "api_reference/flax.nnx/graph.html"),
      "nnx.update": ("flax.nnx.update", "api_reference/flax.nnx/graph.html"),
    },
  ),
  "orbax": (
    "https://orbax.readthedocs.io/en/latest/",
    {
      "orbax.checkpoint.CheckpointManager": (
        "orbax.checkpoint.CheckpointManager",
        "api_reference/checkpoint.checkpoint_manager.html",
      ),
    },
  ),
}


def inventory(project: str) -> bytes:
  """``project``'s ``objects.inv``: each full name at its page's anchor of that name."""
  _, names = PROJECTS[project]
  lines = sorted({f"{full} py:{_kind(full)} 1 {page}#$ -\n" for full, page in names.values()})
  header = (
    "# Sphinx inventory version 2\n"
    f"# Project: {project}\n"
    "# Version: latest\n"
    "# The remainder of this file is compressed using zlib.\n"
  )
  return header.encode() + zlib.compress("".join(lines).encode())


def _kind(full: str) -> str:
  """A class if its name is capitalised, as in these projects; else a function."""
  return "class" if full.rsplit(".", 1)[-1][:1].isupper() else "function"


def write_inventories(folder: pathlib.Path) -> dict[str, tuple[str, str]]:
  """Every project's ``objects.inv`` in ``folder``; the ``intersphinx_mapping`` for them."""
  folder.mkdir(parents=True, exist_ok=True)
  mapping = {}
  for project, (url, _) in PROJECTS.items():
    path = folder / f"{project}.inv"
    written = path.with_suffix(f".{os.getpid()}")  # builds side by side never read half
    written.write_bytes(inventory(project))
    written.replace(path)
    mapping[project] = (url, str(path))
  return mapping


def target(name: str) -> str | None:
  """The full name the pages' ``name`` links to, or None for a name with no entry."""
  for _, names in PROJECTS.values():
    if name in names:
      return names[name][0]
  return None
