#!/usr/bin/env bash
# The README's first command, run as a user on a fresh clone types it: it must build the
# gateway, serve on the embedded defaults, and print a curl line that places an order
# (200) and then meets the mutex (409 DUPLICATE). Then the README's HMAC example, as
# written: signed, the same trade is a 409 DUPLICATE too (a bad signature would be a 401).
# Nothing else ran these: the tests start the built binary directly, so a second binary
# in the package once made `cargo run` ask which to run, and no test saw it.
#
# The release profile is overridden to build fast (no LTO, opt-level 0): the profile
# changes how long the build takes, not which binary runs or what it does. The shipped
# release build is exercised by package.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/order.sh

cmd=$(awk '/^## The two commands/ { s = 1 } s && /^```sh/ { getline; print; exit }' README.md)
[[ $cmd == cargo\ run* ]] || { echo "readme.sh: no cargo run command in README.md: '$cmd'"; exit 1; }
command -v curl > /dev/null || { apt-get update -qq && apt-get install -y -qq curl > /dev/null; }

state=hoox-edge-state
rm -rf "$state"
log=$(mktemp -d)
echo "readme.sh: $cmd"
export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256 \
    CARGO_PROFILE_RELEASE_OPT_LEVEL=0
bash -c "exec $cmd" > "$log/out" 2> "$log/err" &
pid=$!   # cargo, then (cargo run execs it) the gateway itself
# SIGTERM, and its exit status once it is gone: 40 s at most (stop_within, in order.sh), then
# SIGKILL and a failure, where a bare `wait` would hang CI on a gateway that does not stop.
# Reaped either way, so fail() no longer signals that PID, which may be another's by then.
stop() {
    local rc=0
    stop_within "$pid" || rc=$?
    pid=
    return "$rc"
}
fail() {
    echo "readme.sh: $*"
    echo "--- stdout"; cat "$log/out"; echo "--- stderr"; tail -40 "$log/err"
    [[ -z $pid ]] || kill -KILL "$pid" 2> /dev/null || true
    exit 1
}

# Built and listening: it prints its curl line once the listener is bound.
for _ in $(seq 1 600); do
    grep -q "curl --cacert" "$log/out" && break
    kill -0 "$pid" 2> /dev/null || fail "the command exited before serving"
    sleep 1
done
line=$(grep -m1 "curl --cacert" "$log/out") || fail "no curl line within 600 s"

# The database opens just after the listener: 503 until then, and then an order.
answers=$(order_then_duplicate "$line" "$log/body") || fail "$answers"
echo "readme.sh: $answers"

# The HMAC example: the README's block that signs, run as written.
signing=$(awk '/^```sh/ { b = ""; s = 1; next } /^```/ { if (b ~ / sign /) { printf "%s", b; exit } s = 0 }
               s { b = b $0 "\n" }' README.md)
[[ -n $signing ]] || fail "no signing example in README.md"
answer=$(bash -c "$signing" 2> "$log/sign.err") || fail "the signing example failed: $(cat "$log/sign.err")"
rm -f body.json sig.headers
[[ $answer == *'"code":"DUPLICATE"'* ]] || fail "the signed trade answered: $answer"
echo "readme.sh: the signing example answered: $answer"

stop || fail "the gateway did not exit cleanly on SIGTERM (status $?; 124: killed after 40 s)"
rm -rf "$state" "$log"
echo "readme.sh: the README's run command serves"
