"""ws1 harness: comparators, evidence, merge, gate, reports and the `ws1` command line.

The package root imports nothing, so `ws1 gate`, `ws1 merge` and `ws1 report` never import torch; import the
submodules you need (`ws1_harness.run.compare` needs torch, `ws1_harness.verdict.gate` does not).
"""

__version__ = "0.1.0"
