"""Bytes each method sends, and what they cost on accelerators by bandwidth."""
