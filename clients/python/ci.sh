#!/usr/bin/env bash
# CI for the Python client: a virtualenv at clients/python/.venv, the package
# with its dev and langchain extras, a check that the committed gRPC stubs
# match proto/, then the tests against the real server binary.
#
#   bash clients/python/ci.sh                 # from anywhere
#   ARCHIVIST_BIN=/path/to/archivist bash clients/python/ci.sh
#
# The binary defaults to debug/archivist where cargo builds (the repo's
# target/, or CARGO_TARGET_DIR, as `cargo metadata` says: tests/conftest.py
# looks), which `cargo test` (run before this by the top-level CI) builds.
# pytest's exit code is this
# script's exit code; a run that collects no test fails (pytest exits 5),
# and the suite turns any skipped test into a failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"

if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
py="$venv/bin/python"

"$py" -m pip install --quiet --disable-pip-version-check -e "$here[dev,langchain]"

"$py" "$here/generate.py" --check

cd "$here"
exec "$py" -m pytest -p no:cacheprovider "$@"
