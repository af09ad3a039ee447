#!/usr/bin/env python3
"""Generates the gRPC stubs of archivist_client from the repository's proto.

    python generate.py           # rewrite src/archivist_client/v1/archivist_pb2*.py[i]
    python generate.py --check   # regenerate into a temporary directory and fail
                                 # if the committed files differ

The stubs are committed so that installing the client needs neither protoc
nor grpcio-tools; this script (with grpcio-tools from the `dev` extra) is the
only way they are made, and CI runs `--check` so they never drift from
proto/archivist/v1/archivist.proto.

protoc names modules after the proto's path (`archivist.v1.archivist_pb2`),
which would need a top-level `archivist` package. Two lines are rewritten so
the stubs live in `archivist_client.v1` instead (see REWRITES): the service
stub's import of the messages, and the module name the message classes
record (so pickling them works). Nothing else is touched, and the descriptor
keeps its canonical file name (archivist/v1/archivist.proto).
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROTO_ROOT = REPO / "proto"
PROTO = "archivist/v1/archivist.proto"
OUT = HERE / "src" / "archivist_client" / "v1"
FILES = ("archivist_pb2.py", "archivist_pb2.pyi", "archivist_pb2_grpc.py")

# protoc names the modules after the proto's path; here they live in
# archivist_client.v1. Each rewrite must match exactly once.
REWRITES = {
    # The service stub's import of the messages.
    "archivist_pb2_grpc.py": (
        "from archivist.v1 import archivist_pb2 as",
        "from . import archivist_pb2 as",
    ),
    # The module the message classes say they belong to (their __module__),
    # which pickle and copy use to find them again.
    "archivist_pb2.py": (
        "(DESCRIPTOR, 'archivist.v1.archivist_pb2', _globals)",
        "(DESCRIPTOR, 'archivist_client.v1.archivist_pb2', _globals)",
    ),
}


def pinned_tools_version() -> str | None:
    """The grpcio-tools version pinned in pyproject.toml's dev extra."""
    text = (HERE / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'"grpcio-tools==([^"]+)"', text)
    return match.group(1) if match else None


def installed_tools_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("grpcio-tools")
    except PackageNotFoundError:
        return None


def generate(dest: Path) -> dict[str, bytes]:
    """Runs protoc into a scratch directory and returns the finished files."""
    try:
        import grpc_tools  # noqa: F401  (only to say what is missing)
    except ImportError:
        sys.exit(
            "generate.py needs grpcio-tools: pip install -e 'clients/python[dev]'"
        )
    # `python -m grpc_tools.protoc` adds the well-known types
    # (google/protobuf/*.proto) shipped inside grpcio-tools to the path.
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={dest}",
        f"--pyi_out={dest}",
        f"--grpc_python_out={dest}",
        PROTO,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"protoc failed ({result.returncode}):\n{result.stderr}")
    produced = dest / "archivist" / "v1"
    files: dict[str, bytes] = {}
    for name in FILES:
        files[name] = (produced / name).read_bytes()
    for name, (before, after) in REWRITES.items():
        text = files[name].decode("utf-8")
        if text.count(before) != 1:
            sys.exit(f"{name} no longer has exactly one {before!r}: update generate.py")
        files[name] = text.replace(before, after).encode("utf-8")
    return files


def check(files: dict[str, bytes]) -> int:
    stale = []
    for name, fresh in files.items():
        path = OUT / name
        committed = path.read_bytes() if path.exists() else b""
        if committed == fresh:
            continue
        stale.append(name)
        diff = difflib.unified_diff(
            committed.decode("utf-8", "replace").splitlines(keepends=True),
            fresh.decode("utf-8", "replace").splitlines(keepends=True),
            fromfile=f"committed/{name}",
            tofile=f"generated/{name}",
        )
        lines = list(diff)
        sys.stdout.writelines(lines[:60])
        if len(lines) > 60:
            print(f"... {len(lines) - 60} more diff lines")
    if not stale:
        print(f"stubs are up to date with {PROTO}")
        return 0
    print(
        f"\nstale generated files: {', '.join(stale)}\n"
        f"grpcio-tools installed: {installed_tools_version()}, "
        f"pinned: {pinned_tools_version()}\n"
        "run `python clients/python/generate.py` and commit the result",
        file=sys.stderr,
    )
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="fail if the committed stubs differ from freshly generated ones",
    )
    args = parser.parse_args()
    pinned, installed = pinned_tools_version(), installed_tools_version()
    if pinned and installed and pinned != installed:
        print(
            f"warning: grpcio-tools {installed} is installed but {pinned} is pinned;"
            " the output may differ from what CI expects",
            file=sys.stderr,
        )
    with tempfile.TemporaryDirectory() as scratch:
        files = generate(Path(scratch))
    if args.check:
        return check(files)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (OUT / name).write_bytes(data)
        print(f"wrote {(OUT / name).relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
