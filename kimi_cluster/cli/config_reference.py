"""Write or check the configuration reference in docs/configuration.md, generated from the settings model.

    kimi-cluster config-reference --write   # rewrite the table between the file's markers
    kimi-cluster config-reference           # exit 1, naming the file, when it is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kimi_cluster.settings.reference import missing_notes, with_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kimi-cluster config-reference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the generated table in docs/configuration.md")
    args = parser.parse_args(argv)
    missing = missing_notes()
    if missing:
        print(f"error: kimi_cluster/settings/reference.py NOTES lacks {', '.join(missing)}", file=sys.stderr)
        return 1
    text = DOC.read_text(encoding="utf-8")
    fresh = with_reference(text)
    if args.write:
        if fresh != text:
            DOC.write_text(fresh, encoding="utf-8")
        print(f"{DOC.relative_to(DOC.parents[1])}: up to date")
        return 0
    if fresh != text:
        print(f"error: {DOC.relative_to(DOC.parents[1])} is out of date with the settings model; "
              "run kimi-cluster config-reference --write", file=sys.stderr)
        return 1
    print(f"{DOC.relative_to(DOC.parents[1])}: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
