"""Run every deliberately broken candidate of tests/ws1_harness/teeth_profiles.py on every tier (tiny widths).

    python ci/teeth_tiers.py > docs/evidence/calibration-cpu/teeth-tiers.log

CI runs the same faults on the short tier only (tests/ws1_harness/test_harness_teeth_faults.py); this shows them
red on short, primary and long. Faults judged by accuracy alone run on the canonical layout only (the accuracy
judgments read nothing else). Prints one line per (tier, fault): RED-AS-EXPECTED or MISSED, the judgments with
their reasons and, for accuracy, the failing tensors with mismatched/total elements; exits 1 on any miss.
"""

import sys
import time

sys.path.insert(0, "tests/ws1_harness")
import teeth_profiles as tp

from ws1_contract import load_contract
from ws1_harness.run.adapters import build_adapters
from ws1_harness.run.unit import CandidateUnderTest, run_unit
from ws1_kernels import reference
from ws1_workload import build_fixture, load_manifest

m = load_manifest()
c = load_contract()
model = m.model("tiny")
ad = build_adapters(model)
canon = tuple(s for s in m.layouts if s.type == "packed")
bad = 0
for tier in ("short", "primary", "long"):
    fx = build_fixture(m, tier, "tiny")
    for name, f in sorted(tp.FAULTS.items()):
        cand = tp.candidate(name)
        under = CandidateUnderTest(
            cand.candidate_id,
            cand.fn,
            getattr(reference, f.operator),
            cand.all_kernel_ids,
            frozenset(cand.declared_ops),
            cand.param_grad_rule,
        )
        acc_only = set(f.red) <= {"forward_accuracy", "gradient_accuracy"}
        t0 = time.perf_counter()
        r = run_unit(
            under,
            ad[f.operator],
            fx,
            canon if acc_only else m.layouts,
            c,
            m.operators[f.operator].op_class,
            case_id=f"teeth/{f.operator}/{tier}/tiny",
            param_case=f"{f.operator}/tiny",
            pad_id=model.pad_id,
        )
        verdicts = []
        ok = True
        for j in f.red:
            jr = r.judgments[j]
            rs = jr.diagnostics.get("reasons", [jr.reason_code])
            good = jr.status == "red" and bool(f.reasons & set(rs))
            ok &= good
            extra = ""
            if j.endswith("accuracy") and jr.layouts:
                fails = [
                    (ch["tensor"], ch["n_mismatch"], ch["n_total"])
                    for ch in jr.layouts[0]["checks"]
                    if not ch["passed"]
                ]
                extra = f" {fails}"
            verdicts.append(f"{j}={jr.status}:{','.join(rs)}{extra}")
        bad += not ok
        print(
            f"{tier:8} {name:32} {'RED-AS-EXPECTED' if ok else 'MISSED'} {'; '.join(verdicts)} ({time.perf_counter() - t0:.1f}s)",
            flush=True,
        )
print("missed:", bad)
raise SystemExit(1 if bad else 0)
