"""ws1_kernels: operator candidates, fp32 references, registry and launch log (torch only).

See docs/kernels.md.  Public surface::

    from ws1_kernels import LayoutContext, registry, launches, reference
"""

from . import launches, native, portable, reference, registry
from .context import LayoutContext, Segment
from .errors import CandidateUnavailable, KernelError, KernelInputError, RegistryError
from .registry import Candidate

__all__ = [
    "Candidate",
    "CandidateUnavailable",
    "KernelError",
    "KernelInputError",
    "LayoutContext",
    "RegistryError",
    "Segment",
    "launches",
    "native",
    "portable",
    "reference",
    "registry",
]
