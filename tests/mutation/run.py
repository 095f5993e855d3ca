"""`make mutate [FILE=…]`: mutmut 3.8.1's `run`, with FILE mutating that file alone.

mutmut reads `only_mutate` from pyproject.toml only, and a mutant name on its command line
filters the mutants tried only after every listed file was mutated and its stats run (the
whole test selection, every function of every file traced: about 10 min here). With FILE,
`only_mutate` is narrowed to it in this process (mutmut's workers are forks of it); the
stats are kept in mutants/ and run again only when they trace none of FILE's functions (one
pass of the selection). Each mutant is tried against the tests that ran its function.

With FILE, mutmut is named the mutants not yet killed (untried, survived, no tests): named
ones are tried again and the clean run is only their tests; killed ones keep their verdict
until their function changes. The first run of a file, or after its source changed, names
the whole file.
"""

import json
import sys
from pathlib import Path

from mutmut.__main__ import cli
from mutmut.configuration import config

MUTANTS = Path("mutants")
STATS = MUTANTS / "mutmut-stats.json"
KILLED = {1, 3, 36, 24, -24, 152, 255, 37}


def module_of(path: str) -> str:
    return path[: -len(".py")].replace("/", ".")


def not_killed(path: str) -> list[str]:
    """The file's mutants to try again, or its whole pattern when its meta is not current."""
    source, meta = Path(path), MUTANTS / f"{path}.meta"
    if not meta.exists() or meta.stat().st_mtime < source.stat().st_mtime:
        return [f"{module_of(path)}.*"]
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return sorted(name for name, code in codes.items() if code not in KILLED)


def narrow_to(paths: list[str]) -> list[str]:
    cfg = config()
    outside = [path for path in paths if not cfg.should_mutate(path)]
    if outside:
        sys.exit(f"not in [tool.mutmut] only_mutate: {', '.join(outside)}")
    cfg.only_mutate = paths
    for path in paths:
        # A file left out of an earlier run was copied plain, newer than its source: mutmut
        # would take that copy for its mutants.
        copy = MUTANTS / path
        if copy.exists() and "__mutmut_" not in copy.read_text():
            copy.unlink()
    if STATS.exists():
        traced = json.loads(STATS.read_text())["tests_by_mangled_function_name"]
        if not all(any(key.startswith(f"{module_of(p)}.") for key in traced) for p in paths):
            STATS.unlink()
    return [name for path in paths for name in not_killed(path)]


def main(argv: list[str]) -> None:
    paths = [arg for arg in argv if arg.endswith(".py")]
    options = [arg for arg in argv if not arg.endswith(".py")]
    names = narrow_to(paths) if paths else []
    if paths and not names:
        print("every mutant already killed")
        return
    cli(["run", *options, *names])


if __name__ == "__main__":
    main(sys.argv[1:])
