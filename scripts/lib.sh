# shellcheck shell=bash disable=SC2034  # BIN, BUILD and WORK are for the scripts that source this
# scripts/lib.sh: what bench.sh and memstart.sh share. Sourced from the repository root.

# select_build: sets BIN (where the binaries are) and BUILD (cargo's extra arguments) for
# $TARGET, or for the host when it is unset, and builds them unless SKIP_BUILD=1. ring
# compiles C for the target: musl-gcc for a musl one (.ci/package.sh does the same).
select_build() {
    TARGET=${TARGET:-}
    BIN="${CARGO_TARGET_DIR:-target}/release"
    BUILD=()
    if [ -n "$TARGET" ]; then
        BIN="${CARGO_TARGET_DIR:-target}/$TARGET/release"
        BUILD=(--target "$TARGET")
        local cc_var="CC_${TARGET//-/_}"
        if [[ $TARGET == *-musl ]] && [ -z "${!cc_var:-}" ] && command -v musl-gcc >/dev/null; then
            export "$cc_var=musl-gcc"
        fi
    fi
    if [ "${SKIP_BUILD:-0}" != 1 ]; then
        cargo build --release --bins ${BUILD[@]+"${BUILD[@]}"}
    fi
}

# server_limits N...: the `[server]` lines that let one address (the load tool's) hold the most
# connections among N... (the gateway's default is a quarter of max_connections).
server_limits() {
    local most
    most=$(printf '%s\n' "$@" | sort -n | tail -n 1)
    printf 'max_connections = %s\nmax_connections_per_ip = %s\n' \
        "$((most > 1024 ? most : 1024))" "$((most > 256 ? most : 256))"
}

# running PID: whether a process has not exited yet. One that has exited stays a zombie
# (state Z) until its parent reaps it, and `kill -0` or /proc/PID would still find it: a child
# of ours until we `wait`, or, reparented, until PID 1 (or a subreaper) reaps it, which a
# container's init may never do.
running() {
    local state
    state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# work_in DIR: state and logs go to DIR. On exit, every process whose PID is in PIDS is
# killed (and reaped if it is our child), then DIR is removed unless KEEP=1.
work_in() {
    WORK=$1
    mkdir -p "$WORK"
    PIDS=()
    trap cleanup EXIT
    trap 'exit 130' INT TERM
}

# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    local pid
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        wait "$pid" 2>/dev/null || true
    done
    if [ "${KEEP:-0}" != 1 ]; then rm -rf "$WORK"; else echo "$(basename "$0"): kept $WORK"; fi
}
