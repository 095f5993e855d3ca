"""`make mutate [FILE=…]`: mutmut 3.8.1's `run`, with FILE mutating that file alone.

mutmut reads `only_mutate` from pyproject.toml only, and a mutant name on its command line
filters the mutants tried only after every listed file was mutated and its stats run (the
whole test selection, every function of every file traced: about 10 min here). With FILE,
`only_mutate` is narrowed to it in this process (mutmut's workers are forks of it); the
stats are kept in mutants/ and run again only when they trace none of FILE's functions (one
pass of the selection). Each mutant is tried against the tests that ran its function.

A mutant's tests run fastest first, as mutmut's fork runner orders them and its forkserver
runner does not: under `-x` the first that fails kills it, so the pure tests usually do.

With FILE, the file is mutated first (as mutmut would: a changed function's mutants lose
their verdict), then mutmut is named its mutants not killed (untried, survived, no tests):
named ones are tried again and the clean run is only their tests; killed ones keep their
verdict until their function changes.
"""

import json
import sys
from pathlib import Path

from mutmut.__main__ import cli, create_file_mutants
from mutmut.configuration import config
from mutmut.runners.harness import PytestRunner
from mutmut.state import state

MUTANTS = Path("mutants")
STATS = MUTANTS / "mutmut-stats.json"
KILLED = {1, 3, 36, 24, -24, 152, 255, 37}


def fastest_first(run_tests):
    def run(self, *, mutant_name, tests):
        durations = state().duration_by_test
        tests = sorted(tests, key=lambda test: (durations.get(test, 0.0), test))
        return run_tests(self, mutant_name=mutant_name, tests=tests)

    return run


def module_of(path: str) -> str:
    return path[: -len(".py")].replace("/", ".")


def not_killed(path: str) -> list[str]:
    result = create_file_mutants(Path(path))
    if result.error:
        raise result.error
    meta = json.loads((MUTANTS / f"{path}.meta").read_text())
    return sorted(name for name, code in meta["exit_code_by_key"].items() if code not in KILLED)


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
    PytestRunner.run_tests = fastest_first(PytestRunner.run_tests)
    paths = [arg for arg in argv if arg.endswith(".py")]
    options = [arg for arg in argv if not arg.endswith(".py")]
    names = narrow_to(paths) if paths else []
    if paths and not names:
        print("every mutant already killed")
        return
    cli(["run", *options, *names])


if __name__ == "__main__":
    main(sys.argv[1:])
