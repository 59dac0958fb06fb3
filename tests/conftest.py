"""Test configuration: eight simulated CPU devices, set once before JAX starts."""

import jax

jax.config.update("jax_num_cpu_devices", 8)
