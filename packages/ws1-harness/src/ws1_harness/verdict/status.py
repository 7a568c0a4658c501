"""Cell statuses and the registry of machine-readable reason codes.

An earlier gate parsed status out of human-readable messages. Here every verdict is an enum value and every
non-green verdict carries a reason code from one registry, which also says under which statuses a code may
appear. The evidence schema enumerates the same codes (a test keeps the two in sync), so a code that is not
registered here cannot reach a gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ws1_harness.errors import HarnessError


class CellStatus(str, Enum):
    """The verdict of one matrix cell. Only `green` passes; every other value is an open verdict."""

    GREEN = "green"
    RED = "red"
    NA = "na"
    PENDING_ARCH = "pending_arch"
    ERROR = "error"


@dataclass(frozen=True)
class ReasonInfo:
    """What a reason code means and which statuses it may explain."""

    code: str
    statuses: frozenset[CellStatus]
    meaning: str


class ReasonCode(str, Enum):
    """Every reason code a cell, a layout result or a comparison may carry."""

    # comparison outcomes
    BITS_DIFFER = "bits_differ"
    TOLERANCE_EXCEEDED = "tolerance_exceeded"
    NON_FINITE = "non_finite"
    SHAPE_MISMATCH = "shape_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    REFERENCE_DTYPE = "reference_dtype"
    # execution outcomes
    NOT_RUN = "not_run"
    TIMEOUT = "timeout"
    MISSING_BACKWARD = "missing_backward"
    MISSING_GRADIENT = "missing_gradient"
    UNDECLARED_OP = "undeclared_op"
    UNDECLARED_KERNEL = "undeclared_kernel"
    NO_KERNEL_OBSERVED = "no_kernel_observed"
    KERNEL_MISMATCH = "kernel_mismatch"
    INPUT_MODIFIED = "input_modified"
    LAYOUT_NOT_HONOURED = "layout_not_honoured"
    LAYOUT_ERROR = "layout_error"
    EMPTY_ACTIVE_SET = "empty_active_set"
    CANDIDATE_UNAVAILABLE = "candidate_unavailable"
    EXCEPTION = "exception"
    # explained not-applicable
    LAYOUT_ONLY = "layout_only"
    NOT_DIFFERENTIABLE = "not_differentiable"
    OPTIONAL_NOT_PROVIDED = "optional_not_provided"
    # hardware
    ARCH_UNAVAILABLE = "arch_unavailable"
    DEVICE_UNAVAILABLE = "device_unavailable"


_FAIL = frozenset({CellStatus.RED, CellStatus.ERROR})
_NA = frozenset({CellStatus.NA})
_PENDING = frozenset({CellStatus.PENDING_ARCH})

REASONS: dict[str, ReasonInfo] = {
    info.code: info
    for info in (
        ReasonInfo("bits_differ", _FAIL, "raw bits of an invariance pair differ"),
        ReasonInfo("tolerance_exceeded", _FAIL, "abs(c-r) > atol + rtol*abs(r) at some element"),
        ReasonInfo("non_finite", _FAIL, "NaN/Inf in the candidate where the reference has another value"),
        ReasonInfo("shape_mismatch", _FAIL, "compared tensors have different shapes"),
        ReasonInfo("dtype_mismatch", _FAIL, "compared tensors have different dtypes"),
        ReasonInfo("reference_dtype", _FAIL, "the accuracy reference was not fp32"),
        ReasonInfo("not_run", _FAIL, "a required cell produced no result"),
        ReasonInfo("timeout", _FAIL, "the cell exceeded its time limit"),
        ReasonInfo("missing_backward", _FAIL, "the candidate has no backward for a differentiable input"),
        ReasonInfo("missing_gradient", _FAIL, "a gradient the rule promises was not produced"),
        ReasonInfo("undeclared_op", _FAIL, "a torch op outside the candidate's declared ops was dispatched"),
        ReasonInfo("undeclared_kernel", _FAIL, "a kernel other than the profile's kernel id was launched"),
        ReasonInfo("no_kernel_observed", _FAIL, "no launch of the declared kernel was observed"),
        ReasonInfo(
            "kernel_mismatch",
            _FAIL,
            "the kernels a call recorded at its launch sites differ from those Triton's launch hook saw",
        ),
        ReasonInfo(
            "input_modified", _FAIL, "the candidate changed the bits of an input or parameter it was given"
        ),
        ReasonInfo("layout_not_honoured", _FAIL, "the physical layout did not reach the candidate as built"),
        ReasonInfo("layout_error", _FAIL, "a layout could not be built or restored"),
        ReasonInfo("empty_active_set", _FAIL, "an aggregate over an empty active-token set"),
        ReasonInfo(
            "candidate_unavailable", _FAIL, "the registry has no runnable candidate for a required node"
        ),
        ReasonInfo("exception", _FAIL, "the cell raised an unexpected exception"),
        ReasonInfo("layout_only", _NA, "layout helper without a candidate (e.g. pack)"),
        ReasonInfo(
            "not_differentiable",
            _NA,
            "gradient judgment of an operator the manifest marks non-differentiable",
        ),
        ReasonInfo("optional_not_provided", _NA, "optional node that the profile does not provide"),
        ReasonInfo("arch_unavailable", _PENDING, "the candidate needs an arch this device does not have"),
        ReasonInfo("device_unavailable", _PENDING, "the candidate needs a device that is not present"),
    )
}

assert set(REASONS) == {r.value for r in ReasonCode}, "ReasonCode and REASONS disagree"

# Reasons that explain an `na` cell. Anything else, or no reason, is an unexplained na (red at the gate).
NA_REASONS: frozenset[str] = frozenset(
    code for code, info in REASONS.items() if CellStatus.NA in info.statuses
)


class StatusError(HarnessError, ValueError):
    """A status/reason combination that the registry does not allow."""


def check_status_reason(status: CellStatus | str, reason_code: str | None) -> None:
    """Raise StatusError unless `reason_code` may explain `status`.

    green carries no reason; every other status needs a registered reason allowed for it.
    """
    st = CellStatus(status)
    if st is CellStatus.GREEN:
        if reason_code is not None:
            raise StatusError(f"status: green carries no reason code, got {reason_code!r}")
        return
    if reason_code is None:
        raise StatusError(f"status: {st.value} needs a reason code")
    info = REASONS.get(reason_code)
    if info is None:
        raise StatusError(f"status: unknown reason code {reason_code!r}")
    if st not in info.statuses:
        allowed = ", ".join(sorted(s.value for s in info.statuses))
        raise StatusError(f"status: reason {reason_code!r} cannot explain {st.value} (only {allowed})")
