"""The machinery the studies in ``benchmarks/`` share; nothing here is run on its own.

``studies`` (timing and result files), ``variants`` and ``lm_runs`` (the LM runs the
quality studies train, cached run by run), ``quality_summary``, ``quality_claims`` and
``quality_report`` (what those runs say, the paper's claims checked, written out).
"""
