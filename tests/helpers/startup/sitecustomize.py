"""Run by every Python process the suite starts (``tests/conftest.py`` puts this folder on
``PYTHONPATH``, and Python imports a ``sitecustomize`` module it finds there at startup):
the collector tuned as in the suite's own processes (``conftest``), for the LM runs, the
benchmarks and the multi-process jobs. A process that traces and compiles JAX programs
makes millions of short-lived objects while holding large caches, and the default young
threshold (700) walks those caches over and over: a cold LM run of the tiny preset took
22 s of CPU with the default (twice) and 16.5 and 19 s with this one."""

import gc

gc.set_threshold(50_000, 20, 20)
