"""Helpers shared by the tests: simulated workers, compiled-program (HLO) checks, small
models, the example LM and the documentation's examples."""
