"""README.md is the front page: at most 200 lines, with the five-minute tour, and every
relative link in it reaches a file of the repository (so they work on GitHub too)."""

import re

from .reference_hook import ROOT

README = ROOT / "README.md"


def test_readme_is_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= 200


def test_readme_has_the_two_commands_and_the_tour():
    text = README.read_text()
    for said in ("make run", "make test", "## Five-minute tour", "tuneplane apply -f"):
        assert said in text, said


def test_every_relative_link_of_the_readme_reaches_a_file():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    relative = [link for link in links if "://" not in link]
    assert relative
    assert [link for link in relative if not (ROOT / link).exists()] == []
