"""Optimizer-state memory per method, whole and sharded, offload on and off."""
