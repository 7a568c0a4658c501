"""`python -m ws1_contract` runs the `ws1-contract` command line."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
