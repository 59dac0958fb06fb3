"""The studies behind BENCHMARKS.md, a folder per topic (see ``benchmarks/README.md``).

A package so that a study imports another's pieces by topic
(``from benchmarks.quality import quality``); each study runs as a script.
"""
