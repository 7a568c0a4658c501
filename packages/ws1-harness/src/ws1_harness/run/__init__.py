"""The execution side of the harness: the matrix, its tasks and workers, the unit runner and its layouts, the
comparators, the operator adapters, the op watch, the chain and the bench. It needs torch, the workload and the
kernels (`pip install "ws1-harness[run]"`) and writes what the verdict side (`ws1_harness.verdict`) reads.
"""
