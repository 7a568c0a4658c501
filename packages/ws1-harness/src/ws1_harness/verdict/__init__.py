"""The verdict side of the harness: records, evidence files, provenance, merge, re-judgment, the gate, reports.

Nothing here imports torch, the workload, the kernels or `ws1_harness.run`: a machine that only gates evidence
installs the harness without its `run` extra and still runs `ws1 gate`, `ws1 merge` and `ws1 report`.
`tests/ws1_harness/test_harness_seam.py` enforces it from the source.
"""
