"""`ws1 bench`: every kernel's speed against its stock peer, measured side by side in one process.

Modules: `shapes` (benchmark points at the manifest's model widths), `cases` (inputs, candidate call, stock peer
and work per operator), `timing` (do_bench / CUDA-event / CPU wall timers and the copy and mm ceilings),
`targets` (ws1's speed targets and their verdicts), `records` (rows, the JSON document, Markdown), `runner`
(argument checks, the run, the files). docs/bench.md explains the flags and how to read the evidence.
"""

from ws1_harness.run.bench.records import (
    KIND,
    SCHEMA_VERSION,
    BenchInputError,
    is_bench_file,
    write_bench_report,
)

__all__ = ["KIND", "SCHEMA_VERSION", "BenchInputError", "is_bench_file", "write_bench_report"]
