"""The steps' programs compiled for GPUs on any machine (``targets/``: the GPUs' descriptions)."""
