"""Independent NumPy references of the mathematics of docs/MATH.md, in float64.

Written from the documents, never importing the code under test (``lordo_jax``): the
tests compare the package against them.
"""
