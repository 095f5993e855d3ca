"""Sections of the Fleet page that higher apps contribute, so that this app never imports them.

A section is a function ``(fleet) -> dict | None``: the context for its template,
under ``template``, or None when it has nothing to show for this Fleet.
"""

from collections.abc import Callable

Section = Callable[["Fleet"], dict | None]  # noqa: F821 - the model, by name only

_sections: list[Section] = []


def register_fleet_page_section(section: Section) -> Section:
    if section not in _sections:
        _sections.append(section)
    return section


def fleet_page_sections(fleet) -> list[dict]:
    return [shown for section in _sections if (shown := section(fleet)) is not None]
