"""The documentation's generators (docs/_hooks/reference.py, an MkDocs hook, not a package),
loaded by path for the tests beside this module."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "docs" / "_hooks" / "reference.py"


def load():
    name = "tuneplane_docs_reference"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HOOK)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
