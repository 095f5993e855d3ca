"""Every rule of DESIGN.md §5, §7 and §8 is cited by a test that is not end to end (issue 40).

A test cites a rule by naming it: in its name (``test_R3_a_gang_...``), its docstring, or its
module's docstring. The report lists, for each rule, the tests that cite it; a rule cited by
no test outside tests/e2e/ (and the other folders of real processes) fails, unless
NOT_IN_PROCESS says why: proven only end to end, or not built yet.
"""

import ast
import re
from pathlib import Path

from django.conf import settings

ROOT = Path(settings.BASE_DIR)
DESIGN = ROOT.parent / "shared" / "DESIGN.md"
# Folders whose tests start real processes: they prove rules too, but not in process.
END_TO_END = {"e2e", "browser", "slurm", "slurm24", "bench"}
RULE = re.compile(r"(?<![A-Za-z0-9])([FJLDPARSQ]\d{1,2})(?![0-9])")
# Rules no in-process test holds, and why.
NOT_IN_PROCESS: dict[str, str] = {
    "R17": "not built yet (issue 46)",
    "R18": "not built yet (issue 46)",
    "R19": "not built yet (issue 46)",
    "R20": "not built yet (issue 46)",
    "R21": "not built yet (issue 46)",
    "R22": "not built yet (issue 46)",
    "R23": "not built yet (issue 46)",
}


def rules_of_design() -> list[str]:
    """The rule ids DESIGN.md numbers from §5 on: an id, a space, then its text."""
    text = DESIGN.read_text()
    rules = re.findall(
        r"(?:^|(?<=[ .]))([FJLDPARSQ]\d{1,2}) (?=[A-Za-z`(])", text[text.index("## 5.") :], re.M
    )
    return sorted(set(rules), key=lambda rule: (rule[0], int(rule[1:])))


def citations() -> dict[str, set[str]]:
    """Rule id → the tests (path::name) that cite it, in-process tests only."""
    cited: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        relative = path.relative_to(ROOT / "tests")
        if relative.parts[0] in END_TO_END:
            continue
        tree = ast.parse(path.read_text())
        module = set(RULE.findall(ast.get_docstring(tree) or ""))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                named = set(RULE.findall(node.name.replace("_", " ")))
                said = set(RULE.findall(ast.get_docstring(node) or ""))
                for rule in module | named | said:
                    cited.setdefault(rule, set()).add(f"tests/{relative}::{node.name}")
    return cited


def test_every_rule_is_cited_by_an_in_process_test_or_says_why_not(capsys):
    rules, cited = rules_of_design(), citations()
    with capsys.disabled():
        print()
        for rule in rules:
            print(f"rules: {rule}: {len(cited.get(rule, ()))} test(s)")
    uncited = [rule for rule in rules if not cited.get(rule) and rule not in NOT_IN_PROCESS]
    assert not uncited, f"rules no in-process test cites: {uncited}"


def test_a_rule_listed_as_not_held_in_process_is_not_held_in_process():
    """Once a rule gets its test, it leaves NOT_IN_PROCESS: the list says only what is true."""
    cited = citations()
    stale = sorted(rule for rule in NOT_IN_PROCESS if cited.get(rule))
    assert not stale, f"cited in process now, so no longer to be listed: {stale}"


def test_the_rules_read_from_design_are_its_numbered_rules():
    rules = rules_of_design()
    assert {"F1", "J6", "L7", "D4", "P7", "A1", "R16", "S6", "Q9"} <= set(rules)
    assert len(rules) == 8 + 6 + 7 + 4 + 7 + 1 + 16 + 6 + 9
