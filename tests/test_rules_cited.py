"""Every rule of DESIGN.md §5, §7 and §8 is cited by a test that is not end to end (issue 40).

A test cites a rule by naming it: in its name (``test_R3_a_gang_...``), its docstring, or its
module's docstring. The report lists, for each rule, the tests that cite it; a rule cited by
no test that runs in process fails, unless NOT_IN_PROCESS says why: proven only end to end,
or not built yet. A test runs in process unless it is marked ``e2e``: by its folder or node
id (tests/conftest.py's E2E_FOLDERS, E2E_TESTS), its module's or class's ``pytestmark``, or
a decorator; ``-m "not e2e"`` (``make quick``) never runs it (issue 47).
"""

import ast
import re
import sys
from pathlib import Path

from django.conf import settings

ROOT = Path(settings.BASE_DIR)
DESIGN = ROOT.parent / "shared" / "DESIGN.md"
# Folders whose tests start real processes: they prove rules too, but not in process.
END_TO_END = {"e2e", "browser", "slurm", "slurm24", "bench"}
RULE = re.compile(r"(?<![A-Za-z0-9])([FJLDPARSQ]\d{1,2})(?![0-9])")
# Rules no in-process test holds, and why.
NOT_IN_PROCESS: dict[str, str] = {
    "P8": "not built yet (issue 49: a cordoned machine is coming back, admission counts it)",
}


# Rules whose citing tests are all marked e2e, held in process by none, and why (none now:
# the wall's rules are held by the bundle's tests as well as by the attacks on a real agent).
# A rule leaves once an in-process test cites it (the last test here says so).
E2E_ONLY_ALLOWED: dict[str, str] = {}


def rules_of_design() -> list[str]:
    """The rule ids DESIGN.md numbers from §5 on: an id, a space, then its text."""
    text = DESIGN.read_text()
    rules = re.findall(
        r"(?:^|(?<=[ .]))([FJLDPARSQ]\d{1,2}) (?=[A-Za-z`(])", text[text.index("## 5.") :], re.M
    )
    return sorted(set(rules), key=lambda rule: (rule[0], int(rule[1:])))


def _marks_e2e(expression: ast.expr, aliases: set[str]) -> bool:
    """Whether a decorator or ``pytestmark`` value is (or lists) ``pytest.mark.e2e``, or a
    module name bound to it (``real = pytest.mark.e2e``)."""
    return any(
        (isinstance(part, ast.Attribute) and part.attr == "e2e")
        or (isinstance(part, ast.Name) and part.id in aliases)
        for part in ast.walk(expression)
    )


def _pytestmark(body: list[ast.stmt], aliases: set[str]) -> bool:
    return any(
        isinstance(statement, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in statement.targets)
        and _marks_e2e(statement.value, aliases)
        for statement in body
    )


def cited_tests() -> dict[str, dict[str, bool]]:
    """Rule id → the tests (path::name) that cite it, each with whether it is marked ``e2e``
    the way tests/conftest.py marks it (its folder, its node id) or its module, class or
    decorators do: such a test does not run in ``-m "not e2e"``, so it holds no rule in
    process."""
    from tests.conftest import E2E_FOLDERS, E2E_TESTS

    cited: dict[str, dict[str, bool]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        relative = path.relative_to(ROOT / "tests")
        folder_e2e = relative.parts[0] in END_TO_END | set(E2E_FOLDERS)
        tree = ast.parse(path.read_text())
        module = set(RULE.findall(ast.get_docstring(tree) or ""))
        aliases = {
            target.id
            for statement in tree.body
            if isinstance(statement, ast.Assign) and _marks_e2e(statement.value, set())
            for target in statement.targets
            if isinstance(target, ast.Name) and target.id != "pytestmark"
        }
        module_e2e = folder_e2e or _pytestmark(tree.body, aliases)
        classes_e2e = {
            id(method): _pytestmark(cls.body, aliases)
            or any(_marks_e2e(d, aliases) for d in cls.decorator_list)
            for cls in ast.walk(tree)
            if isinstance(cls, ast.ClassDef)
            for method in cls.body
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                test = f"tests/{relative}::{node.name}"
                e2e = (
                    module_e2e
                    or classes_e2e.get(id(node), False)
                    or any(_marks_e2e(d, aliases) for d in node.decorator_list)
                    or test in E2E_TESTS
                )
                named = set(RULE.findall(node.name.replace("_", " ")))
                said = set(RULE.findall(ast.get_docstring(node) or ""))
                for rule in module | named | said:
                    cited.setdefault(rule, {})[test] = e2e
    return cited


def citations() -> dict[str, set[str]]:
    """Rule id → the in-process tests (not marked ``e2e``) that cite it."""
    return {
        rule: in_process
        for rule, tests in cited_tests().items()
        if (in_process := {test for test, e2e in tests.items() if not e2e})
    }


def e2e_only() -> list[str]:
    """The rules some test cites, but only tests marked ``e2e``."""
    everything, in_process = cited_tests(), citations()
    return sorted(rule for rule in everything if rule not in in_process)


def test_every_rule_is_cited_by_an_in_process_test_or_says_why_not(capsys):
    rules, cited, everything = rules_of_design(), citations(), cited_tests()
    with capsys.disabled():
        print()
        for rule in rules:
            e2e = len(everything.get(rule, ())) - len(cited.get(rule, ()))
            print(f"rules: {rule}: {len(cited.get(rule, ()))} test(s), {e2e} more marked e2e")
    excused = NOT_IN_PROCESS.keys() | E2E_ONLY_ALLOWED.keys()
    uncited = [rule for rule in rules if not cited.get(rule) and rule not in excused]
    e2e = [rule for rule in uncited if everything.get(rule)]
    assert not uncited, f"rules no in-process test cites: {uncited}" + (
        f" (of them, cited only by tests marked e2e: {e2e})" if e2e else ""
    )


def test_a_rule_listed_as_not_held_in_process_is_not_held_in_process():
    """Once a rule gets its test, it leaves NOT_IN_PROCESS: the list says only what is true."""
    cited = citations()
    stale = sorted(rule for rule in NOT_IN_PROCESS if cited.get(rule))
    assert not stale, f"cited in process now, so no longer to be listed: {stale}"


def test_the_rules_read_from_design_are_its_numbered_rules():
    rules = rules_of_design()
    assert {"F1", "J6", "L7", "D4", "P8", "A1", "R23", "S6", "Q9"} <= set(rules)
    assert len(rules) == 8 + 6 + 7 + 4 + 8 + 1 + 23 + 6 + 9


def test_a_rule_allowed_e2e_only_is_cited_only_by_tests_marked_e2e():
    """E2E_ONLY_ALLOWED says only what is true: each rule there has tests, all marked e2e."""
    cited, everything = citations(), cited_tests()
    wrong = sorted(rule for rule in E2E_ONLY_ALLOWED if cited.get(rule) or not everything.get(rule))
    assert not wrong, f"not (or no longer) cited by e2e tests only: {wrong}"


def test_a_test_marked_e2e_holds_no_rule_in_process(tmp_path, monkeypatch):
    """Marked by its module, a decorator, a name bound to the mark, or its folder: not
    counted; the same test unmarked is."""
    tests = tmp_path / "tests"
    (tests / "nodes").mkdir(parents=True)
    (tests / "e2e").mkdir()
    (tests / "nodes" / "test_marked.py").write_text(
        "import pytest\n"
        "real = pytest.mark.e2e\n"
        "@pytest.mark.e2e\ndef test_R11_decorated(): pass\n"
        "@real\ndef test_R12_by_name(): pass\n"
        "class TestThem:\n    pytestmark = pytest.mark.e2e\n"
        "    def test_R13_in_a_class(self): pass\n"
        "def test_R14_unmarked(): pass\n"
    )
    (tests / "nodes" / "test_module.py").write_text(
        "import pytest\npytestmark = [pytest.mark.e2e]\ndef test_R15_module(): pass\n"
    )
    (tests / "e2e" / "test_folder.py").write_text("def test_R16_folder(): pass\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert set(citations()) == {"R14"}
    assert e2e_only() == ["R11", "R12", "R13", "R15", "R16"]
