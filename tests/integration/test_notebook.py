"""notebooks/quickstart.ipynb executes top to bottom with a few steps."""

import os
import pathlib

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_runs(monkeypatch):
  root = str(NOTEBOOK.parents[1])
  monkeypatch.setenv("LORDO_QUICKSTART_STEPS", "16")
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(
    notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": root}}
  )
  client.execute()
  outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
  text = "".join(o.get("text", "") for o in outputs)
  assert "8 devices; 16 steps" in text
  assert "lordo  validation loss" in text and "ddp    validation loss" in text
  assert any("image/png" in o.get("data", {}) for o in outputs)  # The plots.
  assert "'host'" in text  # lordo_jax.state_bytes
