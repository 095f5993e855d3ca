"""Generate the Python modules for proto/tuneplane/node/v1 with the pinned grpcio-tools.

The modules are committed in nodes/agent/proto/ (the agent and the gateway both
use them); `python proto/generate.py --check` fails when they are out of date,
and the test suite runs that check.
"""

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent
OUT = ROOT.parent / "nodes" / "agent" / "proto"
SOURCES = ["tuneplane/node/v1/control.proto"]
# protoc writes absolute imports from the proto package; ours live inside the agent package.
ABSOLUTE = "from tuneplane.node.v1 import "
RELATIVE = "from . import "


def generate(into: Path) -> list[Path]:
    with tempfile.TemporaryDirectory() as scratch:
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{ROOT}",
                f"--python_out={scratch}",
                f"--grpc_python_out={scratch}",
                *SOURCES,
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed with {code}")
        written = []
        for path in sorted(Path(scratch, "tuneplane/node/v1").glob("*.py")):
            target = into / path.name
            target.write_text(path.read_text().replace(ABSOLUTE, RELATIVE))
            written.append(target)
        return written


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--check",
        action="store_true",
        help="Exit 1 if the committed modules differ from a fresh generation.",
    )
    args = parser.parse_args()
    if not args.check:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "__init__.py").touch()
        for path in generate(OUT):
            print(f"wrote {path.relative_to(ROOT.parent)}")
        return 0
    with tempfile.TemporaryDirectory() as fresh:
        stale = [
            path.name
            for path in generate(Path(fresh))
            if not filecmp.cmp(path, OUT / path.name, shallow=False)
        ]
    if stale:
        print(f"out of date: {', '.join(stale)}; run `python proto/generate.py`", file=sys.stderr)
        return 1
    print("generated modules are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
