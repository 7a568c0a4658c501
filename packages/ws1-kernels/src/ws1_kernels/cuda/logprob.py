"""logp (cuda_bf16): the selected-token log-probability of bf16 logits, fp32 out (``torch.ops.ws1.logp_fwd``).

One block per row: fixed-order max and sum of ``exp(x - max)`` (the order depends only on V), ``lse`` kept for the
backward, ``dlogits = g * (onehot - exp(x - lse))`` one element per thread (csrc/kernels/logprob.cu).
"""

from __future__ import annotations

import torch

from .. import _validate as v
from ..backend import OpEntry
from ..context import LayoutContext
from ..launches import record
from ..op_checks import check_targets
from ._common import check_inputs

KERNEL = "ws1.cuda.logp.rowwise"


class _Logp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets):  # type: ignore[override]
        record(KERNEL, "fwd")
        out, lse = torch.ops.ws1.logp_fwd(logits, targets)
        ctx.save_for_backward(logits, targets, lse)
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None
        record(KERNEL, "bwd")
        logits, targets, lse = ctx.saved_tensors
        return torch.ops.ws1.logp_bwd(logits, targets, lse, g.float().contiguous()), None


def logp(logits: torch.Tensor, targets: torch.Tensor, ctx: LayoutContext) -> torch.Tensor:
    """``log_softmax(logits)[t, targets[t]]`` in fp32: ``[T,V], [T] -> [T]``."""
    where = "cuda_bf16.logp"
    v.tensor(where, "logits", logits, 2, None)
    check_inputs(where, ctx, logits.shape[0], logits=logits)
    check_targets(where, targets, logits.shape[1], logits.shape[0])
    if targets.device != logits.device:
        raise v.KernelInputError(f"{where}: targets on {targets.device}, logits on {logits.device}")
    return _Logp.apply(logits, targets.contiguous())


# aminmax/_local_scalar_dense: the host check of the target range; _to_copy/clone: g as contiguous fp32;
# detach: autograd's bookkeeping
_DECLARED = frozenset(
    {
        "ws1.logp_fwd",
        "ws1.logp_bwd",
        "aten.aminmax",
        "aten._local_scalar_dense",
        "aten._to_copy",
        "aten.clone",
        "aten.detach",
    }
)
OPS: dict[str, OpEntry] = {"logp": OpEntry(logp, KERNEL, _DECLARED)}
