"""Replace the device machine's paths in an evidence folder's logs before they are committed: `<out>` for the call's
output folder, `<checkout>` for the clone the device session ran in, `<venv>` for the machine's torch environment.

Why: the logs quote absolute paths of a machine that no longer exists, which tell a reader nothing and differ
from call to call, and `docs/evidence/README.md` promises the replacement. Until now it was done by hand (and
missed in places). JSON files are left as they came back: they carry their own provenance, and the gate reads
them. Text files only (`.log`, `.txt`, `.md`); a file is rewritten only when something in it changed.

    python ci/clean_evidence_paths.py docs/evidence/<bundle>            # rewrite, one line per changed file
    python ci/clean_evidence_paths.py docs/evidence/<bundle> --check    # exit 1 if any path is left

Exit 0 when done (or, with --check, when nothing is left); 1 with --check when something is; 2 on a bad argument,
one line.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

#: (device path, placeholder); a path is replaced only where it stands whole (not inside a longer path such as
#: `/home/root/outputs`), in one pass over the original text (so a replacement is never matched again)
REPLACEMENTS: tuple[tuple[str, str], ...] = (
    ("/tmp/ws1-device-clone", "<checkout>"),  # ci/device_session.sh's CLONE_DIR default
    ("/opt/torch/.venv", "<venv>"),  # the H200's torch environment (the device tool's KINDS.md)
    ("/root/out", "<out>"),  # the call's $OUT
)
TEXT_SUFFIXES = frozenset({".log", ".txt", ".md"})


_PATTERN = re.compile("|".join(rf"(?<![\w./-]){re.escape(path)}(?![\w.-])" for path, _ in REPLACEMENTS))
_PLACEHOLDER = dict(REPLACEMENTS)


def clean_text(text: str) -> tuple[str, int]:
    """The text with every device path replaced, and how many replacements were made."""
    return _PATTERN.subn(lambda m: _PLACEHOLDER[m.group(0)], text)


def text_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a device path is left")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"clean_evidence_paths: {args.folder} is not a folder", file=sys.stderr)
        return 2
    left = 0
    for path in text_files(args.folder):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            print(f"clean_evidence_paths: {path}: not UTF-8 text, left as it is", file=sys.stderr)
            continue
        cleaned, count = clean_text(text)
        if not count:
            continue
        left += count
        if args.check:
            print(f"{path}: {count} device paths")
        else:
            path.write_text(cleaned, encoding="utf-8")
            print(f"{path}: {count} device paths replaced")
    return 1 if args.check and left else 0


if __name__ == "__main__":
    sys.exit(main())
