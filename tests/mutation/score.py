"""The mutation score of each mutated file, from mutmut's results in mutants/ (`make mutate`):
killed (a timeout counts as killed) of those tried, and the survivors by name. Run from the
checkout's root; with paths, only those files."""

import json
import sys
from pathlib import Path

KILLED = {1, 3, 36, 24, -24, 152, 255, 37}
SURVIVED = {0}
NO_TESTS = {5, 33}


def main(paths: list[str]) -> None:
    metas = sorted(Path("mutants").rglob("*.py.meta"))
    for meta in metas:
        source = str(meta.relative_to("mutants"))[: -len(".meta")]
        if paths and source not in paths:
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        tried = {name: code for name, code in codes.items() if code is not None}
        if not tried:
            continue
        killed = sum(code in KILLED for code in tried.values())
        survived = sorted(name for name, code in tried.items() if code in SURVIVED | NO_TESTS)
        print(
            f"{source}: {killed}/{len(tried)} killed ({100 * killed / len(tried):.0f} %),"
            f" {len(codes) - len(tried)} not tried yet"
        )
        for name in survived:
            print(f"  survived: {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
