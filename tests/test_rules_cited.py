"""Every numbered rule of the console — its own page, docs/reference/rules.md — is cited by a
test that runs in process (issues 40, 47, 49).

A test cites a rule by naming it: in its name (``test_R3_a_gang_...``), its docstring, or its
module's docstring. The report lists, for each rule, the tests that cite it. A rule no test
running in process cites fails, unless NOT_IN_PROCESS says it is not built yet; a rule whose
only citing tests are marked ``e2e`` fails whatever the lists say. A test runs in process
unless it is marked ``e2e``: by its folder or node id (tests/conftest.py's E2E_FOLDERS,
E2E_TESTS), its module's or class's ``pytestmark``, or a decorator; ``-m "not e2e"`` (``make
quick``) never runs it (issue 47). The rule ids come from the page's headings (``### Q2 — …
{#q2}``), so nothing here reads outside the repository; every rule id the console quotes to
its users (``(rule D2)``, ``rule="J4"``, ``(Q8)`` in a message or a template) is on the page.
"""

import ast
import re
import sys
from pathlib import Path

from django.conf import settings

ROOT = Path(settings.BASE_DIR)
PAGE = ROOT / "docs" / "reference" / "rules.md"
# Folders whose tests start real processes: they prove rules too, but not in process.
END_TO_END = {"e2e", "browser", "slurm", "slurm24", "bench"}
RULE = re.compile(r"(?<![A-Za-z0-9])([FJLDPARSQH]\d{1,2})(?![0-9])")
# A rule's heading on the page: its id, a dash, what it says, and its anchor.
HEADING = re.compile(r"^### ([A-Z]\d{1,2}) — (.+?)(?: \{#([^}]*)\})?$", re.M)
# Rules no in-process test holds because they are not built yet, and why. A rule leaves once
# an in-process test cites it (test_a_rule_listed_as_not_held_in_process_...).
NOT_IN_PROCESS: dict[str, str] = {}
# How many rules the page numbers, per letter (F Fleets, J joining, L liveness, D draining,
# P placement, A audit, R running work, S serving, Q sharing, H hardware faults).
PER_LETTER = {"F": 8, "J": 6, "L": 7, "D": 4, "P": 8, "A": 1, "R": 23, "S": 6, "Q": 9, "H": 8}
# Rule letters the console may quote before the page has their section, and why.
QUOTED_BEFORE_THE_PAGE: dict[str, str] = {}
# Where the console quotes rules to its users: messages, help texts, the admin's templates.
QUOTING = ("tuneplane", "audit", "fleets", "nodes", "placement", "cli", "templates")
QUOTE = re.compile(r"\brule[ =]+[\"']?([A-Z]\d{1,2})(?![0-9])|\(([A-Z]\d{1,2})(?![0-9])[,;)\s]")


def rules_of_page(path: Path = PAGE) -> list[str]:
    """The rule ids the project's rules page numbers, one heading each."""
    rules = [match.group(1) for match in HEADING.finditer(path.read_text())]
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


def uncited(rules: list[str]) -> tuple[list[str], list[str]]:
    """The rules that no in-process test cites and NOT_IN_PROCESS does not excuse, and the
    rules whose only citing tests are marked e2e (never excused)."""
    cited, e2e = citations(), set(e2e_only())
    missing = [rule for rule in rules if not cited.get(rule) and rule not in NOT_IN_PROCESS]
    return missing, [rule for rule in rules if rule in e2e]


def test_every_rule_is_cited_by_an_in_process_test_or_says_why_not(capsys):
    rules, cited, everything = rules_of_page(), citations(), cited_tests()
    with capsys.disabled():
        print()
        for rule in rules:
            e2e = len(everything.get(rule, ())) - len(cited.get(rule, ()))
            print(f"rules: {rule}: {len(cited.get(rule, ()))} test(s), {e2e} more marked e2e")
    missing, _ = uncited(rules)
    assert not missing, f"rules no in-process test cites: {missing}"


def test_no_rule_is_cited_only_by_tests_marked_e2e():
    """Issue 47: a rule proven only end to end is not held by ``make quick`` (nor by ``make
    mutate``): it fails here even when NOT_IN_PROCESS lists it."""
    _, e2e = uncited(rules_of_page())
    assert not e2e, f"rules cited only by tests marked e2e: {e2e}"


def test_a_rule_listed_as_not_held_in_process_is_not_held_in_process():
    """Once a rule gets its test, it leaves NOT_IN_PROCESS: the list says only what is true."""
    cited, rules = citations(), rules_of_page()
    stale = sorted(rule for rule in NOT_IN_PROCESS if cited.get(rule) or rule not in rules)
    assert not stale, f"cited in process now, or not a rule of the page: {stale}"


def test_the_rules_read_from_the_page_are_its_numbered_rules():
    rules = rules_of_page()
    assert {"F1", "J6", "L7", "D4", "P8", "A1", "R23", "S6", "Q9"} <= set(rules)
    per_letter = {letter: sum(rule[0] == letter for rule in rules) for letter in PER_LETTER}
    assert per_letter == PER_LETTER
    assert {rule[0] for rule in rules} <= set(PER_LETTER)
    for letter, count in PER_LETTER.items():  # numbered from 1, none skipped
        assert [rule for rule in rules if rule[0] == letter] == [
            f"{letter}{n}" for n in range(1, count + 1)
        ]


def test_each_rule_has_one_heading_and_its_own_anchor():
    """``rules.md#q2`` finds Q2: the id the console quotes is a link."""
    headings = HEADING.findall(PAGE.read_text())
    ids = [rule for rule, _, _ in headings]
    assert len(ids) == len(set(ids)), sorted({rule for rule in ids if ids.count(rule) > 1})
    wrong = [(rule, anchor) for rule, _, anchor in headings if anchor != rule.lower()]
    assert not wrong, f"a rule's heading ends with {{#<its id in lower case>}}: {wrong}"


def test_the_page_is_the_projects_own_and_reads_nothing_outside_the_repository():
    text = PAGE.read_text()
    assert "<!-- tuneplane:" not in text  # written, not generated from a file elsewhere
    # A path to the folder beside the checkout, spelled apart: this file names no place outside.
    assert "/".join(("..", "shared")) not in text and "DESIGN.md" not in text


def quoted_rules() -> dict[str, set[str]]:
    """Rule id → the files in which the console quotes it to a user: a string that is not a
    docstring (an error's message, a help text, an admin label) or a template."""
    found: dict[str, set[str]] = {}
    for top in QUOTING:
        for path in sorted((ROOT / top).rglob("*")):
            parts = path.relative_to(ROOT).parts
            if {"migrations", "build", "__pycache__"} & set(parts) or not path.is_file():
                continue
            texts: list[str] = []
            if path.suffix == ".py":
                tree = ast.parse(path.read_text())
                docstrings = {
                    id(node.body[0].value)
                    for node in ast.walk(tree)
                    if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
                    and node.body
                    and isinstance(node.body[0], ast.Expr)
                }
                texts = [
                    node.value
                    for node in ast.walk(tree)
                    if isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and id(node) not in docstrings
                ]
            elif path.suffix in {".html", ".txt"}:
                texts = [path.read_text()]
            for text in texts:
                for match in QUOTE.finditer(text):
                    rule = match.group(1) or match.group(2)
                    found.setdefault(rule, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_rule_the_console_quotes_is_on_the_page():
    """Issue 49: an error's ``(rule Q2)``, the admin's ``(D1)`` can be looked up."""
    quoted, rules = quoted_rules(), set(rules_of_page())
    assert {"D1", "Q2", "Q8"} <= set(quoted)
    missing = {
        rule: sorted(paths)
        for rule, paths in quoted.items()
        if rule not in rules and rule[0] not in QUOTED_BEFORE_THE_PAGE
    }
    assert not missing, f"quoted by the console, not on docs/reference/rules.md: {missing}"


def test_a_letter_quoted_before_the_page_has_its_section_is_not_on_the_page_yet():
    """QUOTED_BEFORE_THE_PAGE says only what is true: once the page numbers a letter's rules,
    the letter leaves the list."""
    letters = {rule[0] for rule, _, _ in HEADING.findall(PAGE.read_text())}
    assert not letters & set(QUOTED_BEFORE_THE_PAGE)


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
    # Listed as not built yet or not, a rule cited only end to end fails; one cited by no
    # test at all fails unless listed.
    monkeypatch.setattr(sys.modules[__name__], "NOT_IN_PROCESS", {"R11": "", "R18": ""})
    assert uncited(["R11", "R14", "R17", "R18"]) == (["R17"], ["R11"])
