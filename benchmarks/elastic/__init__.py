"""Elastic training: a run resumed on another number of workers, workers away."""
