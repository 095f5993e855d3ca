"""The settings reference (docs/reference/settings.md) is generated from tuneplane/settings.py
at each build: every TUNEPLANE_* setting is on it, with the default the code really has."""

import json
import os
import re
import subprocess
import sys

from django.conf import settings as django_settings

from .reference_hook import ROOT, load

SETTINGS_PY = ROOT / "tuneplane" / "settings.py"


def test_every_tuneplane_setting_is_on_the_generated_page():
    page = load().render_settings()
    listed = set(re.findall(r"`(TUNEPLANE_[A-Z0-9_]+)`", page))
    # Two readings independent of the generator: every TUNEPLANE_* name the settings module
    # spells, and every TUNEPLANE_* setting Django ends up with.
    spelled = set(re.findall(r"[\"'](TUNEPLANE_[A-Z0-9_]+)[\"']", SETTINGS_PY.read_text()))
    configured = {name for name in dir(django_settings) if name.startswith("TUNEPLANE_")}
    assert spelled, "no TUNEPLANE_* name found in tuneplane/settings.py"
    assert not (spelled | configured) - listed, "missing from the settings reference"


def test_the_page_holds_the_generated_table():
    assert "<!-- tuneplane:settings -->" in (ROOT / "docs/reference/settings.md").read_text()


def test_the_defaults_shown_are_the_ones_the_code_has():
    """The settings module imported with no TUNEPLANE_* in its environment (in a process of
    its own), its values against what the generator says their defaults are."""
    reader = load()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEPLANE_")}
    env["DJANGO_SETTINGS_MODULE"] = "tuneplane.settings"
    script = (
        "import json, django; from django.conf import settings as s; django.setup();"
        "print(json.dumps({n: getattr(s, n) for n in dir(s) if n.startswith('TUNEPLANE_')"
        " and isinstance(getattr(s, n), (int, str, bool))}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    actual = json.loads(done.stdout.strip().splitlines()[-1])
    generated = {s.env: s for s in reader.read_settings() if s.name == s.env}
    compared = 0
    for name, value in actual.items():
        default = generated[name].default
        if generated[name].kind == "text" and isinstance(value, int):
            default = int(default)
        assert value == (default if default is not None else ""), name
        compared += 1
    assert compared >= 30, compared


def test_every_note_is_for_a_setting_that_exists():
    reader = load()
    names = {setting.env for setting in reader.read_settings()}
    assert not set(reader.NOTES) - names, "notes for settings the code no longer reads"


def test_a_setting_added_to_the_code_appears_with_its_default_and_comment(tmp_path):
    source = SETTINGS_PY.read_text() + (
        "\n# How many widgets a node may hold.\n"
        'TUNEPLANE_WIDGETS = env_seconds("TUNEPLANE_WIDGETS", 2 * 3600)\n'
    )
    path = tmp_path / "settings.py"
    path.write_text(source)
    page = load().render_settings(path)
    assert "| `TUNEPLANE_WIDGETS` | 7200 s (2 h) | How many widgets a node may hold. |" in page
