"""Step time: the optimizer step and the LM's step, on CPU and on the device JAX runs on."""
