# Sourced by readme.sh and package.sh.
#
# order_then_duplicate LINE BODY runs the curl line a gateway printed at start until its
# database is open (503, or no answer, until then; up to ~20 s), and expects it to place an
# order (200), then to meet the mutex (409 DUPLICATE). Prints each answer; returns 1 at the
# first wrong one, saying which. 120 s at most for the two: a gateway that accepts
# connections but never answers holds each try for its whole --max-time, and 100 tries of
# 20 s per answer came to over an hour. The last try is cut short to fit.
order_then_duplicate() {
    local line=$1 body=$2 answer code left deadline=$((SECONDS + 120))
    for answer in 200 409; do
        code=000
        for _ in $(seq 1 100); do
            left=$((deadline - SECONDS))
            ((left > 0)) || break
            # The line is a gateway's own, aimed at 127.0.0.1; the bound on its time is ours.
            code=$(bash -c "$line --silent --max-time $((left < 20 ? left : 20)) -o '$body' -w '%{http_code}'") || code=000
            [[ $code == 503 || $code == 000 ]] || break
            sleep 0.2
        done
        if [[ $code != "$answer" ]]; then
            ((SECONDS < deadline)) || echo -n "gave up after 120 s: "
            echo "the curl line answered $code, not $answer: $(cat "$body" 2> /dev/null)"
            return 1
        fi
        echo "the curl line answered $code: $(head -c 300 "$body")"
    done
}

# stop_within PID [SECONDS]: SIGTERM to PID, a child of this shell started by the caller,
# then reap it and return its exit status. If it still runs after SECONDS (default 40: the
# gateway gives in-flight requests 30 s to drain), SIGKILL it, say so, and return 124 (as
# timeout(1) does; no exit of the gateway's own is 124).
# `wait` alone has no time limit, so this polls /proc; there, a child that has exited but is
# not reaped yet is a zombie (state Z), to which `kill -0` would still answer. A PID whose
# parent is no longer this shell has been reaped and reused: never signalled again.
stop_within() {
    local pid=$1 secs=${2:-40} i stat state ppid
    kill -TERM "$pid" 2> /dev/null || true
    for ((i = 0; i < secs * 10; i++)); do
        stat=$(cat "/proc/$pid/stat" 2> /dev/null) || break
        read -r state ppid _ <<< "${stat##*) }"
        [[ $state != Z && $ppid == "$BASHPID" ]] || break
        sleep 0.1
    done
    if ((i >= secs * 10)); then
        kill -KILL "$pid" 2> /dev/null || true
        wait "$pid" 2> /dev/null || true
        echo "process $pid did not exit within $secs s of SIGTERM: killed (SIGKILL)" >&2
        return 124
    fi
    wait "$pid" 2> /dev/null
}
