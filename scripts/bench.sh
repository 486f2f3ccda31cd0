#!/usr/bin/env bash
# scripts/bench.sh: what does the gateway cost, and does it keep its promise under fire?
#
#   scripts/bench.sh             fsync and hand-off baselines, bare TLS vs gateway (paper executor) at
#                                1/16/64 connections, open loop at 1k req/s, mutex bench
#   scripts/bench.sh --storm     also: many connections, few keys, http executor -> ledger
#   scripts/bench.sh --chaos     also: SIGKILL the gateway under load again and again, restart,
#                                then check the ledger: no key forwarded twice
#   scripts/bench.sh --no-main --chaos   only the chaos part
#
# Everything listens on 127.0.0.1, every process started here is killed by PID on exit, and
# every step is bounded in time. Knobs (environment):
#   DURATION_S=10  CONNECTIONS="1 16 64"  ROUNDS=1 (bare/gateway pairs per connection count,
#   and paced-disk/bare/gateway triples at RATE; the table and the verdicts take medians)  RATE=1000  RATE_CONNECTIONS=16  PROTOCOL=http1|http2
#   AUTH=bearer|apikey|hmac  FSYNC_COUNT=1000  PORT_BASE=18440 (uses PORT_BASE..+3)
#   LATE_MAX_US=1000 (the open loop subtracts the lowest bare p50/p99 of all the rounds from each
#     round's gateway's; a round is dropped from the verdict when its gateway p99 is under that
#     bare p99, or its gateway run's pacer was late p99 over this without real-time priority;
#     a round whose gateway run exited nonzero is invalid, and then no verdict is MET; the
#     verdict over all valid rounds, none dropped, is printed beside; a MET from a lowest bare
#     run whose generator was late over this is INCONCLUSIVE)
#   BENCH_DIR (state; default a fresh folder in $TMPDIR or /var/tmp)  KEEP=1 (keep it)
#   SKIP_BUILD=1  MUTEX_BENCH=0 (skip cargo bench --bench mutex)
#   TARGET=x86_64-unknown-linux-musl: measure the static build that ships (needs the rustup
#     target and musl-gcc, for ring's C as in .ci/package.sh). All three binaries (gateway,
#     bare TLS baseline, load tool) come from one `cargo build --target` and every build uses
#     mimalloc, so they share one allocator. Default: the host build (x86_64 gnu), comparable
#     with docs/BENCHMARKS.md's history; musl's memcpy makes the shipped build ~10% costlier
#     per response there, and the musl load tool takes more of the two cores.
#   STORM_CONNECTIONS=64 STORM_KEYS=8 STORM_S=5
#   CHAOS_ROUNDS=10 CHAOS_CONNECTIONS=16 CHAOS_DUP=0.3 CHAOS_REPLAY=50000 (replay every key
#     that got a 2xx, or a uniform random sample of this many when more did)
#   STORM_TRIALS=100 CHAOS_CYCLES=60: --storm and --chaos also run CI's tests/storm.rs (1000
#     concurrent identical webhooks per trial) and tests/chaos.rs (SIGKILL cycles) with these
#     counts (CI runs 20 of each), on a release build of the tests (`cargo test --release`)
set -euo pipefail

MAIN=1 STORM=0 CHAOS=0
for arg in "$@"; do
    case "$arg" in
        --storm) STORM=1 ;;
        --chaos) CHAOS=1 ;;
        --no-main) MAIN=0 ;;
        -h | --help) sed -n '2,35p' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown argument $arg" >&2; exit 64 ;;
    esac
done

DURATION_S=${DURATION_S:-10}
ROUNDS=${ROUNDS:-1}
CONNECTIONS=${CONNECTIONS:-"1 16 64"}
RATE=${RATE:-1000}
RATE_CONNECTIONS=${RATE_CONNECTIONS:-16}
PROTOCOL=${PROTOCOL:-http1}
AUTH=${AUTH:-bearer}
FSYNC_COUNT=${FSYNC_COUNT:-1000}
LATE_MAX_US=${LATE_MAX_US:-1000}
PORT_BASE=${PORT_BASE:-18440}
MUTEX_BENCH=${MUTEX_BENCH:-1}
STORM_CONNECTIONS=${STORM_CONNECTIONS:-64}
STORM_KEYS=${STORM_KEYS:-8}
STORM_S=${STORM_S:-5}
CHAOS_ROUNDS=${CHAOS_ROUNDS:-10}
CHAOS_CONNECTIONS=${CHAOS_CONNECTIONS:-16}
CHAOS_DUP=${CHAOS_DUP:-0.3}
CHAOS_REPLAY=${CHAOS_REPLAY:-50000}
STORM_TRIALS=${STORM_TRIALS:-100}
CHAOS_CYCLES=${CHAOS_CYCLES:-60}
# The counts are compared and computed with in bash: `[ x -gt N ]` on a knob that is not a
# plain integer is an error that reads as false (so LATE_MAX_US=1e3 would drop nothing), and
# `$((...))` takes a word for a variable's name and a leading 0 for octal. Said now, not
# minutes into a run.
for knob in DURATION_S ROUNDS RATE RATE_CONNECTIONS FSYNC_COUNT LATE_MAX_US PORT_BASE \
    STORM_CONNECTIONS STORM_KEYS STORM_S CHAOS_ROUNDS CHAOS_CONNECTIONS CHAOS_REPLAY \
    STORM_TRIALS CHAOS_CYCLES; do
    [[ ${!knob} =~ ^(0|[1-9][0-9]{0,8})$ ]] || {
        echo "bench.sh: $knob=${!knob}: not a plain integer (digits only, no leading 0)" >&2
        exit 64
    }
done
read -ra conns <<<"$CONNECTIONS"
for c in ${conns[@]+"${conns[@]}"}; do
    [[ $c =~ ^[1-9][0-9]{0,8}$ ]] || {
        echo "bench.sh: CONNECTIONS=\"$CONNECTIONS\": $c is not a plain integer over 0" >&2
        exit 64
    }
done

GW_PORT=$PORT_BASE
BARE_PORT=$((PORT_BASE + 1))
ADMIN_PORT=$((PORT_BASE + 2))
LEDGER_PORT=$((PORT_BASE + 3))

cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
# The host's triple names the build; without rustc (SKIP_BUILD=1 on a box that only runs
# the binaries), the usual Linux one for this machine.
HOST=$(rustc -vV 2>/dev/null | sed -n 's/^host: //p') || HOST=
HOST=${HOST:-$(uname -m)-unknown-linux-gnu}
case "${TARGET:-$HOST}" in
    *-musl) BUILD_NAME="${TARGET:-$HOST}, static, mimalloc (what ships)" ;;
    *-gnu) BUILD_NAME="${TARGET:-$HOST}, mimalloc, dynamic (the static build ships)" ;;
    *) BUILD_NAME="${TARGET:-$HOST}" ;;
esac
select_build
for b in hoox-load bare-tls; do
    [ -x "$BIN/$b" ] || { echo "bench.sh: $BIN/$b not built" >&2; exit 1; }
done
if [ ! -x "$BIN/hoox-edge" ]; then
    # Baselines alone are still worth having; the gateway parts need the gateway.
    echo "bench.sh: $BIN/hoox-edge not built: baselines only" >&2
    STORM=0 CHAOS=0 GATEWAY=0
else
    GATEWAY=1
fi

work_in "${BENCH_DIR:-$(mktemp -d "${TMPDIR:-/var/tmp}/hoox-bench.XXXXXX")}"

# start NAME PATTERN CMD...: run CMD in the background, wait (bounded) for PATTERN on its
# output; sets STARTED_PID.
start() {
    local name=$1 pattern=$2
    shift 2
    : >"$WORK/$name.log" # exists before the first grep below, whoever runs first
    "$@" >"$WORK/$name.log" 2>&1 &
    STARTED_PID=$!
    PIDS+=("$STARTED_PID")
    for _ in $(seq 200); do
        grep -q "$pattern" "$WORK/$name.log" && return 0
        if ! kill -0 "$STARTED_PID" 2>/dev/null; then break; fi
        sleep 0.1
    done
    echo "bench.sh: $name did not start:" >&2
    tail -n 20 "$WORK/$name.log" >&2
    exit 1
}

# forget PID: a reaped PID may be reused by someone else's process; never signal it again.
forget() {
    local keep=() pid
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        [ "$pid" = "$1" ] || keep+=("$pid")
    done
    PIDS=(${keep[@]+"${keep[@]}"})
}

# stop PID [SIGNAL]: signal one process we started and reap it. One still running 30 s after
# the signal gets SIGKILL: a gateway hung in its shutdown must not hang the bench.
stop() {
    kill "-${2:-TERM}" "$1" 2>/dev/null || true
    for _ in $(seq 300); do
        running "$1" || break
        sleep 0.1
    done
    if running "$1"; then
        echo "bench.sh: process $1 still running 30 s after SIG${2:-TERM}: SIGKILL" >&2
        kill -KILL "$1" 2>/dev/null || true
    fi
    wait "$1" 2>/dev/null || true
    forget "$1"
}

# jget FILE FIELD: a number from hoox-load's one-line JSON (field names are unique in it).
jget() {
    { grep -o "\"$2\":[-0-9.e+]*" "$1" 2>/dev/null || true; } | head -n 1 | cut -d: -f2
}

# cpu_ticks PID: user + system CPU time of a process, in clock ticks.
cpu_ticks() {
    awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0
}

# load NAME PORT ARGS...: one bounded hoox-load run against 127.0.0.1:PORT, JSON kept as NAME.json.
# With SERVER_PID set, also the server's CPU time per served response: unlike req/s, it does
# not depend on how much of the two cores the load generator took. req/s is hoox-load's
# throughput_rps: served answers only (2xx, and 409 for a repeated trade), so a server that
# answers 401 or 503 fast neither looks fast nor lifts a ratio. Any other answer, or a failed
# request, makes hoox-load exit nonzero: said here and counted in FAILED. Sets LOAD_RC.
load() {
    local name=$1 port=$2 t0
    shift 2
    t0=$(cpu_ticks "${SERVER_PID:-0}")
    LOAD_RC=0
    timeout 600 "$BIN/hoox-load" run --url "https://127.0.0.1:$port/webhook" --ca "$WORK/tls/cert.pem" \
        "--$PROTOCOL" --auth "$AUTH" --secret-file "$WORK/secrets/token" --json "$@" \
        >"$WORK/$name.json" || LOAD_RC=$?
    # Kept for the tables and verdicts below: a failed run's histogram holds fast refusals
    # (503, 401) or leaves out failed requests, so it measures nothing and counts for nothing.
    echo "$LOAD_RC" >"$WORK/$name.rc"
    printf '  %-22s %9.0f req/s  p50 %6s us  p99 %6s us  max %7s us  %s\n' "$name" \
        "$(jget "$WORK/$name.json" throughput_rps)" "$(jget "$WORK/$name.json" p50)" \
        "$(jget "$WORK/$name.json" p99)" "$(jget "$WORK/$name.json" max)" \
        "$(grep -o '"status":{[^}]*}' "$WORK/$name.json" | cut -c10-)"
    if [ -n "${SERVER_PID:-}" ]; then
        awk -v t="$(($(cpu_ticks "$SERVER_PID") - t0))" -v hz="$(getconf CLK_TCK)" \
            -v n="$(jget "$WORK/$name.json" served)" 'BEGIN {
                if (n > 0) printf "%.0f\n", t / hz * 1e6 / n }' >"$WORK/$name.cpu"
        [ ! -s "$WORK/$name.cpu" ] || printf '  %-22s server cpu %s us per response\n' "" "$(cat "$WORK/$name.cpu")"
    fi
    if [ "$LOAD_RC" != 0 ]; then
        # 1 ledger, 2 could not run, 3 no answer, 4 answers other than 2xx/409 or failed
        # requests, 5 a replayed key forwarded again, 124 timed out.
        printf '  %-22s FAIL: hoox-load exited %s, errors %s\n' "" "$LOAD_RC" \
            "$(grep -o '"errors":{[^}]*}' "$WORK/$name.json" | cut -c10-)"
        FAILED=1
    fi
    # Open loop: how late the generator was against its schedule (its own clock: pacer; a send
    # also waits for a free connection). Small next to the p99 means the server is measured.
    local late
    late=$(jget "$WORK/$name.json" send_late_p99_us)
    if [ -n "$late" ]; then
        printf '  %-22s generator late p99: pacer %s us (real-time: %s), send %s us\n' "" \
            "$(jget "$WORK/$name.json" pacer_late_p99_us)" \
            "$(grep -o '"pacer_realtime":[a-z]*' "$WORK/$name.json" | cut -d: -f2)" "$late"
    fi
}

# gateway_config DIR KIND: a config for the gateway in DIR, executor KIND (paper | http).
gateway_config() {
    mkdir -p "$1"
    {
        printf '[server]\nlisten = "127.0.0.1:%s"\ncert = "%s"\nkey = "%s"\n' \
            "$GW_PORT" "$WORK/tls/cert.pem" "$WORK/tls/key.pem"
        # shellcheck disable=SC2086 # lists of counts
        server_limits $CONNECTIONS "$RATE_CONNECTIONS" "$STORM_CONNECTIONS" "$CHAOS_CONNECTIONS"
        echo
        printf '[admin]\nlisten = "127.0.0.1:%s"\n\n' "$ADMIN_PORT"
        printf '[store]\npath = "%s"\nttl = "300s"\n\n' "$1/mutex.redb"
        printf '[auth]\napi_keys_file = "%s"\nhmac_secrets_file = "%s"\nbearer_tokens_file = "%s"\n\n' \
            "$WORK/secrets/token" "$WORK/secrets/token" "$WORK/secrets/token"
        if [ "$2" = http ]; then
            printf '[executor]\nkind = "http"\nurl = "http://127.0.0.1:%s/orders"\ntimeout = "2s"\n' \
                "$LEDGER_PORT"
        else
            printf '[executor]\nkind = "paper"\n'
        fi
    } >"$1/config.toml"
}

start_gateway() {
    start "gateway-$(basename "$1")" "gateway on" "$BIN/hoox-edge" serve --config "$1/config.toml"
    GW_PID=$STARTED_PID
}

# server_view: where the gateway's own time went, from its /metrics (plain HTTP on the
# admin port): its handler's latency, the journal's fsyncs, and the checkpoints, during
# which the mutex answers nobody. What the load tool's p99 cannot tell apart.
server_view() {
    local text
    text=$(exec 3<>"/dev/tcp/127.0.0.1/$ADMIN_PORT" &&
        printf 'GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3 &&
        timeout 5 cat <&3) || { echo "  (no /metrics from the gateway)"; return 0; }
    awk '
        function le(line) { match(line, /le="[^"]*"/); return substr(line, RSTART + 4, RLENGTH - 5) }
        /^hoox_request_duration_seconds_bucket/ { req[le($0)] = $2 }
        /^hoox_mutex_fsync_seconds_bucket/ { fs[le($0)] = $2 }
        /^hoox_mutex_checkpoint_seconds_sum/ { cs = $2 }
        /^hoox_mutex_checkpoint_seconds_count/ { cn = $2 }
        END {
            if (req["+Inf"] > 0)
                printf "  %-22s its handler: %.1f%% under 1 ms, %.1f%% under 2.5 ms\n", "",
                    100 * req["0.001"] / req["+Inf"], 100 * req["0.0025"] / req["+Inf"]
            if (fs["+Inf"] > 0)
                printf "  %-22s journal fsyncs: %d, %.2f%% over 1 ms; checkpoints: %d, mean %.2f ms\n", "",
                    fs["+Inf"], 100 * (fs["+Inf"] - fs["0.001"]) / fs["+Inf"], cn,
                    (cn > 0 ? 1000 * cs / cn : 0)
        }' <<<"$text"
}

# The shared pieces: one certificate for both servers, one secret for every auth method.
"$BIN/hoox-load" gen-cert --dir "$WORK/tls" >/dev/null
mkdir -p "$WORK/secrets" "$WORK/state"
chmod 700 "$WORK/secrets"
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/secrets/token")

FS=$(df -T "$WORK" | awk 'NR == 2 { print $2 " on " $1 }')
echo "== hoox-edge bench, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores," \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), state on $FS"
echo "   build $BUILD_NAME, $(uptime | sed 's/.*load average/load average/')"
echo "   protocol $PROTOCOL, auth $AUTH, ${DURATION_S}s per run, work dir $WORK"
FAILED=0

if [ "$MAIN" = 1 ]; then
    echo "-- fsync baseline (write 4 KiB + fdatasync, $FSYNC_COUNT times, in the state dir)"
    "$BIN/hoox-load" fsync --dir "$WORK/state" --count "$FSYNC_COUNT" --json >"$WORK/fsync.json"
    FSYNC_P50=$(jget "$WORK/fsync.json" p50_us)
    FSYNC_P99=$(jget "$WORK/fsync.json" p99_us)
    SYNC_CPU=$(jget "$WORK/fsync.json" cpu_us_per_sync)
    echo "  fsync p50 $FSYNC_P50 us  p99 $FSYNC_P99 us  $(jget "$WORK/fsync.json" syncs_per_s) syncs/s," \
        "cpu ${SYNC_CPU:-?} us per sync"
    # The journal syncs with one O_DIRECT | O_DSYNC write where the file system takes it
    # (docs/DESIGN.md): so do the paced baselines below, and this one shows what it gains.
    DIRECT=(--direct) DIRECT_P50=
    if "$BIN/hoox-load" fsync --dir "$WORK/state" --count "$FSYNC_COUNT" --direct --json \
        >"$WORK/fsync-direct.json" 2>/dev/null; then
        # The journal's way of syncing, so its CPU is the one the verdict quotes, and its p50
        # the "one fsync" of the 1k req/s allowance.
        SYNC_CPU=$(jget "$WORK/fsync-direct.json" cpu_us_per_sync)
        DIRECT_P50=$(jget "$WORK/fsync-direct.json" p50_us)
        echo "  direct (O_DIRECT | O_DSYNC, as the journal): p50 $(jget "$WORK/fsync-direct.json" p50_us) us" \
            " p99 $(jget "$WORK/fsync-direct.json" p99_us) us  $(jget "$WORK/fsync-direct.json" syncs_per_s) syncs/s," \
            "cpu ${SYNC_CPU:-?} us per sync"
    else
        echo "  direct I/O refused on this file system: the journal uses write + fdatasync"
        DIRECT=()
    fi
    # Does this disk overlap flushes? If two writers sync nearly twice as often at the same
    # latency, a group commit with two syncs in flight would wait less than one that queues
    # every batch behind the sync before it (the mutex's, today).
    "$BIN/hoox-load" fsync --dir "$WORK/state" --count "$FSYNC_COUNT" --writers 2 --json \
        >"$WORK/fsync-2.json"
    awk -v one="$(jget "$WORK/fsync.json" syncs_per_s)" -v two="$(jget "$WORK/fsync-2.json" syncs_per_s)" \
        -v p50="$(jget "$WORK/fsync-2.json" p50_us)" 'BEGIN {
            if (one > 0) printf "  fsync by 2 writers: p50 %d us, %d syncs/s (%.2f x one writer)\n", p50, two, two / one }'

    # Every reserve crosses to the owner thread and back. What one such round trip costs
    # here, between two bare threads, with the other asleep: on a VM whose idle vCPUs halt,
    # a wake across CPUs is far dearer than one within a CPU (docs/BENCHMARKS.md).
    echo "-- hand-off baseline (a round trip between two threads, the other asleep in between)"
    "$BIN/hoox-load" handoff --json >"$WORK/handoff.json"
    "$BIN/hoox-load" handoff --one-cpu --json >"$WORK/handoff-1.json"
    HANDOFF_P50=$(jget "$WORK/handoff.json" p50_us)
    echo "  any CPU: p50 $HANDOFF_P50 us  p99 $(jget "$WORK/handoff.json" p99_us) us;" \
        "one CPU: p50 $(jget "$WORK/handoff-1.json" p50_us) us  p99 $(jget "$WORK/handoff-1.json" p99_us) us"

    # Closed loop: bare and gateway run back to back at each connection count, ROUNDS times,
    # so that the shared machine's drift (the bare server's req/s moved 58k-86k within an
    # hour here) hits a pair alike and the ratio compares like with like.
    echo "-- closed loop: bare TLS (hyper + rustls, no work), then the gateway (paper executor,"
    echo "   fresh store per run), at each connection count; $ROUNDS round(s)"
    start bare "listening on" "$BIN/bare-tls" --listen "127.0.0.1:$BARE_PORT" \
        --cert "$WORK/tls/cert.pem" --key "$WORK/tls/key.pem"
    BARE_PID=$STARTED_PID
    for r in $(seq "$ROUNDS"); do
        for c in $CONNECTIONS; do
            SERVER_PID=$BARE_PID
            load "bare-c$c-r$r" "$BARE_PORT" --connections "$c" --duration "${DURATION_S}s"
            [ "$GATEWAY" = 1 ] || continue
            gateway_config "$WORK/state/paper-c$c-r$r" paper
            start_gateway "$WORK/state/paper-c$c-r$r"
            SERVER_PID=$GW_PID
            load "gateway-c$c-r$r" "$GW_PORT" --connections "$c" --duration "${DURATION_S}s"
            stop "$GW_PID"
        done
    done
    # Open loop: the disk alone at the same rate first, then bare and gateway back to back,
    # ROUNDS times. The tail moves most with the machine: on one quiet evening the same
    # build's added p99 went from 0.1 ms to 2.4 ms between pairs minutes apart, so a pair
    # shares its minutes and the verdict takes the median of the rounds.
    echo "-- open loop at $RATE req/s, $RATE_CONNECTIONS connections: the disk paced alone, then bare"
    echo "   and the gateway (fresh store per run) back to back; $ROUNDS round(s)"
    unset SERVER_PID
    # The disk is shared and its fsync time drifts (other writers, writeback): judge the
    # open loop against a baseline taken just before it, not minutes ago.
    "$BIN/hoox-load" fsync --dir "$WORK/state" --count "$FSYNC_COUNT" --json \
        >"$WORK/fsync-rate.json"
    FSYNC_P50=$(jget "$WORK/fsync-rate.json" p50_us)
    echo "  fsync again, just before the open loop: p50 $FSYNC_P50 us" \
        " p99 $(jget "$WORK/fsync-rate.json" p99_us) us"
    if [ -n "$DIRECT_P50" ]; then
        if "$BIN/hoox-load" fsync --dir "$WORK/state" --count "$FSYNC_COUNT" --direct --json \
            >"$WORK/fsync-direct-rate.json" 2>/dev/null; then
            DIRECT_P50=$(jget "$WORK/fsync-direct-rate.json" p50_us)
            echo "  direct again, just before the open loop: p50 $DIRECT_P50 us" \
                " p99 $(jget "$WORK/fsync-direct-rate.json" p99_us) us"
        else
            echo "  direct again, just before the open loop: refused this time; the allowance and" \
                "the paced baselines take write + fdatasync"
            DIRECT=() DIRECT_P50=
        fi
    fi
    # Two syncs in flight at the open loop's rate: what a pipelined group commit could reach.
    "$BIN/hoox-load" fsync --dir "$WORK/state" --count "$((RATE * DURATION_S))" \
        --rate "$RATE" --writers 2 ${DIRECT[@]+"${DIRECT[@]}"} --json >"$WORK/fsync-paced-2.json"
    echo "  fsync ${DIRECT[*]+direct }paced at $RATE/s, 2 writers: p50 $(jget "$WORK/fsync-paced-2.json" p50_us) us" \
        " p99 $(jget "$WORK/fsync-paced-2.json" p99_us) us"
    for r in $(seq "$ROUNDS"); do
        # The disk's own tail at this rate, in this round's minutes: one sync per due write
        # (group commit), timed from each write's schedule, so a slow sync counts for every
        # write queued behind it, as it does for the gateway's reserves.
        "$BIN/hoox-load" fsync --dir "$WORK/state" --count "$((RATE * DURATION_S))" \
            --rate "$RATE" ${DIRECT[@]+"${DIRECT[@]}"} --json >"$WORK/fsync-paced-r$r.json"
        printf '  %-22s p50 %6s us  p99 %6s us  max %7s us\n' "fsync-paced-r$r" \
            "$(jget "$WORK/fsync-paced-r$r.json" p50_us)" "$(jget "$WORK/fsync-paced-r$r.json" p99_us)" \
            "$(jget "$WORK/fsync-paced-r$r.json" max_us)"
        SERVER_PID=$BARE_PID
        load "bare-rate-r$r" "$BARE_PORT" --connections "$RATE_CONNECTIONS" --duration "${DURATION_S}s" \
            --rate "$RATE"
        unset SERVER_PID
        [ "$GATEWAY" = 1 ] || continue
        gateway_config "$WORK/state/paper-rate-r$r" paper
        start_gateway "$WORK/state/paper-rate-r$r"
        SERVER_PID=$GW_PID
        load "gateway-rate-r$r" "$GW_PORT" --connections "$RATE_CONNECTIONS" \
            --duration "${DURATION_S}s" --rate "$RATE"
        server_view
        stop "$GW_PID"
        unset SERVER_PID
    done
    stop "$BARE_PID"
fi

# median: the median of the numbers on stdin, one per line (0 if none). Empty lines are
# skipped: `printf '%s\n'` of an empty list is one empty line, not a 0.
median() {
    sort -g | awk 'NF { v[++n] = $1 } END { if (n == 0) print 0; else if (n % 2) print v[(n + 1) / 2];
        else print (v[n / 2] + v[n / 2 + 1]) / 2 }'
}

# field_median FIELD FILES...: the median of one field over several hoox-load results.
field_median() {
    local field=$1 f
    shift
    for f in "$@"; do jget "$f" "$field"; done | median
}

# run_rc NAME: how hoox-load's run NAME exited ("" if it never ran).
run_rc() {
    cat "$WORK/$1.rc" 2>/dev/null || true
}

# failed_run NAME WHO: nothing if hoox-load's run NAME exited 0 with a result; else why it
# counts for nothing. A run that exited nonzero (4: an answer not served, or a failed
# request) has a histogram of fast refusals, or one without its failures: it measures
# neither the server's throughput nor its latency.
failed_run() {
    local rc
    rc=$(run_rc "$1")
    if [ -z "$rc" ] || [ -z "$(jget "$WORK/$1.json" p99)" ]; then
        echo "$2 run gave no result${rc:+ (hoox-load exited $rc)}"
    elif [ "$rc" != 0 ]; then
        echo "$2 run: hoox-load exited $rc (status" \
            "$({ grep -o '"status":{[^}]*}' "$WORK/$1.json" || true; } | cut -c10-), errors" \
            "$({ grep -o '"errors":{[^}]*}' "$WORK/$1.json" || true; } | cut -c10-))"
    fi
}

# smaller A B: whether the number A is below B.
smaller() {
    awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'
}

if [ "$MAIN" = 1 ] && [ "$GATEWAY" = 1 ]; then
    echo
    # Closed loop, each connection's next request sent as its answer comes: at saturation,
    # where latency is about connections / req/s, so these added latencies are the throughput
    # gap again, not what the gateway adds at a given rate (the open loop's, below). A round
    # whose bare or gateway run exited nonzero is left out of its row (FAIL in the per-round
    # column, why below the table), and a row with no round left says FAIL, not a ratio.
    echo "| connections | bare req/s | gateway req/s | gateway/bare | per round | closed-loop added p50 at saturation (us) | closed-loop added p99 at saturation (us) |"
    echo "|---|---|---|---|---|---|---|"
    closed_fails=() cpu16_bare=() cpu16_gw=()
    for c in $CONNECTIONS; do
        bs=() gs=() rs=() per=() nfail=0
        for r in $(seq "$ROUNDS"); do
            why=$(failed_run "bare-c$c-r$r" bare; failed_run "gateway-c$c-r$r" gateway)
            if [ -n "$why" ]; then
                per+=("FAIL")
                nfail=$((nfail + 1))
                closed_fails+=("closed loop, $c connections, round $r: not counted: $(paste -sd ';' <<<"$why" | sed 's/;/; /g')")
                continue
            fi
            bs+=("$WORK/bare-c$c-r$r.json") gs+=("$WORK/gateway-c$c-r$r.json")
            if [ "$c" = 16 ]; then
                cpu16_bare+=("$WORK/bare-c$c-r$r.cpu") cpu16_gw+=("$WORK/gateway-c$c-r$r.cpu")
            fi
            # Served answers per second (throughput_rps), never answers that only say the
            # gateway refused or failed.
            ratio=$(awk -v b="$(jget "$WORK/bare-c$c-r$r.json" throughput_rps)" \
                -v g="$(jget "$WORK/gateway-c$c-r$r.json" throughput_rps)" \
                'BEGIN { printf "%.2f\n", (b > 0 ? g / b : 0) }')
            rs+=("$ratio") per+=("$ratio")
        done
        if [ ${#rs[@]} -eq 0 ]; then
            echo "| $c | - | - | FAIL: no round without a failed run | ${per[*]} | - | - |"
            if [ "$c" = 16 ]; then C16="FAIL: no round at 16 connections without a failed run (see above)"; fi
            continue
        fi
        ratio=$(printf '%s\n' "${rs[@]}" | median)
        note=
        [ "$nfail" = 0 ] || note=" (${#rs[@]} of $ROUNDS rounds: $nfail with a failed run left out)"
        awk -v c="$c" -v br="$(field_median throughput_rps "${bs[@]}")" -v gr="$(field_median throughput_rps "${gs[@]}")" \
            -v ratio="$ratio" -v note="$note" -v per="${per[*]}" \
            -v b50="$(field_median p50 "${bs[@]}")" -v g50="$(field_median p50 "${gs[@]}")" \
            -v b99="$(field_median p99 "${bs[@]}")" -v g99="$(field_median p99 "${gs[@]}")" 'BEGIN {
                printf "| %s | %.0f | %.0f | %.2f%s | %s | %d | %d |\n", c, br, gr, ratio, note, per,
                    g50 - b50, g99 - b99 }'
        if [ "$c" = 16 ]; then C16="$(awk -v r="$ratio" 'BEGIN { printf "%.2f", r }')$note"; fi
    done
    if [ "$ROUNDS" -gt 1 ]; then
        echo "(req/s and latencies: medians over the rounds; gateway/bare: median of the rounds' ratios)"
    fi
    echo "(added p50/p99 above: closed loop at saturation, latency ~ connections / req/s; the" \
        "gateway-added latency at $RATE req/s is the open loop's, below)"
    for line in ${closed_fails[@]+"${closed_fails[@]}"}; do
        echo "$line"
    done
    echo
    # Open loop. Bare is subtracted conservatively: each round's gateway p50 and p99 less the
    # LOWEST bare p50 and p99 among all the rounds' bare runs that exited 0, not the round's
    # own bare run, so a noisy bare run can only make the added figures larger, never smaller
    # (each round's own bare p99 is printed beside, for reference). Were that lowest bare run
    # itself late in its generator (pacer or send p99 over LATE_MAX_US: then every bare run
    # was slowed), a verdict that would be MET is INCONCLUSIVE instead.
    # A round whose gateway run exited nonzero is INVALID: not counted at all, and then no
    # verdict is MET (NOT MET, how many failed): the gateway failed a request or refused one
    # at this rate, whatever the other rounds' figures. A valid round
    # is DROPPED from the verdict when it cannot measure the gateway: its p99 under the lowest
    # bare's, or its pacer late by more than LATE_MAX_US at p99 while it ran without
    # real-time priority (it waited behind the servers for a core: the lateness is the
    # machine's; with real-time priority the pacer is first in line, and whatever delays it
    # counts against the gateway). The verdict over every valid round, none dropped, is
    # printed beside. The p99 less the disk's paced p99 in the same round: the part of the
    # tail that is not the disk's, its verdict under the same rules (failed gateway runs,
    # a late bare floor).
    if [ -n "$DIRECT_P50" ]; then
        ALLOW_P50=$DIRECT_P50 ALLOW_NAME="direct write, as the journal syncs"
    else
        ALLOW_P50=$FSYNC_P50 ALLOW_NAME="write + fdatasync, direct I/O refused here"
    fi
    bare_min99='' bare_min50='' bare_min_r='' bare_n=0 bare_late=''
    for r in $(seq "$ROUNDS"); do
        why=$(failed_run "bare-rate-r$r" bare)
        if [ -n "$why" ]; then
            echo "open loop round $r: bare run not counted in bare's floor: $why"
            continue
        fi
        bare_n=$((bare_n + 1))
        b=$(jget "$WORK/bare-rate-r$r.json" p99) b5=$(jget "$WORK/bare-rate-r$r.json" p50)
        if [ -z "$bare_min99" ] || smaller "$b" "$bare_min99"; then bare_min99=$b bare_min_r=$r; fi
        if [ -z "$bare_min50" ] || smaller "$b5" "$bare_min50"; then bare_min50=$b5; fi
    done
    # late_in JSON: the generator's p99 lateness over LATE_MAX_US in one run, or nothing.
    late_in() {
        local what us out=()
        for what in pacer send; do
            us=$(jget "$1" "${what}_late_p99_us")
            if [ -n "$us" ] && [ "${us%.*}" -gt "$LATE_MAX_US" ]; then out+=("$what ${us%.*} us"); fi
        done
        if [ ${#out[@]} -gt 0 ]; then echo "${out[*]}"; fi
    }
    if [ -n "$bare_min_r" ]; then
        bare_late=$(late_in "$WORK/bare-rate-r$bare_min_r.json")
    fi
    added=() added50=() over_disk=() g50s=() g99s=() d99s=() all=() per=() gw_invalid=0
    for r in $(seq "$ROUNDS"); do
        bj="$WORK/bare-rate-r$r.json" gj="$WORK/gateway-rate-r$r.json"
        b=$(jget "$bj" p99) d=$(jget "$WORK/fsync-paced-r$r.json" p99_us)
        blate=$(late_in "$bj")
        bnote=()
        [ -z "$(failed_run "bare-rate-r$r" bare)" ] || bnote+=("run failed")
        [ -z "$blate" ] || bnote+=("generator late p99: $blate")
        own="its own bare p99 ${b:-?} us"
        if [ ${#bnote[@]} -gt 0 ]; then own+=" ($(printf '%s; ' "${bnote[@]}" | sed 's/; $//'))"; fi
        why=$(failed_run "gateway-rate-r$r" gateway)
        # Only the gateway's own failure counts against the verdict; a round invalid for want
        # of a bare floor or of the disk's paced figure is merely not measured.
        [ -z "$why" ] || gw_invalid=$((gw_invalid + 1))
        [ -n "$bare_min99" ] || why="${why:+$why; }no bare run exited 0 with a result"
        [ -n "$d" ] || why="${why:+$why; }no paced fsync result"
        if [ -n "$why" ]; then
            echo "open loop round $r: INVALID, not counted: $why; $own"
            per+=("invalid")
            continue
        fi
        g=$(jget "$gj" p99) g5=$(jget "$gj" p50)
        a=$(awk -v g="$g" -v b="$bare_min99" 'BEGIN { printf "%d", g - b }')
        a5=$(awk -v g="$g5" -v b="$bare_min50" 'BEGIN { printf "%d", g - b }')
        all+=("$a")
        drop=()
        [ "$a" -ge 0 ] || drop+=("its p99 $g us under the lowest bare p99 $bare_min99 us")
        gl=$(jget "$gj" pacer_late_p99_us)
        rt=$({ grep -o '"pacer_realtime":[a-z]*' "$gj" || true; } | cut -d: -f2)
        if [ "$rt" != true ] && [ -n "$gl" ] && [ "${gl%.*}" -gt "$LATE_MAX_US" ]; then
            drop+=("its pacer late p99 ${gl%.*} us > $LATE_MAX_US us, not at real-time priority")
        fi
        line="open loop round $r: gateway p50 $g5 us, p99 $g us; added p50 $a5 us, p99 $a us; $own"
        if [ ${#drop[@]} -gt 0 ]; then
            echo "$line; DROPPED: $(printf '%s, ' "${drop[@]}" | sed 's/, $//')"
            per+=("$a (dropped)")
            continue
        fi
        per+=("$a")
        echo "$line"
        added+=("$a") added50+=("$a5") over_disk+=("$(awk -v a="$a" -v d="$d" 'BEGIN { printf "%d", a - d }')")
        g50s+=("$g5") g99s+=("$g") d99s+=("$d")
    done
    awk -v rate="$RATE" -v n="${#added[@]}" -v n_all="${#all[@]}" -v rounds="$ROUNDS" \
        -v per="$(printf '%s, ' ${per[@]+"${per[@]}"} | sed 's/, $//')" -v gw_invalid="$gw_invalid" \
        -v disk_per="${d99s[*]:-}" \
        -v over="$(printf '%s\n' ${over_disk[@]+"${over_disk[@]}"} | median)" \
        -v g50="$(printf '%s\n' ${g50s[@]+"${g50s[@]}"} | median)" \
        -v g99="$(printf '%s\n' ${g99s[@]+"${g99s[@]}"} | median)" \
        -v b50="$bare_min50" -v b99="$bare_min99" -v bare_r="$bare_min_r" -v bare_n="$bare_n" \
        -v bare_late="$bare_late" \
        -v added="$(printf '%s\n' ${added[@]+"${added[@]}"} | median)" \
        -v added_all="$(printf '%s\n' ${all[@]+"${all[@]}"} | median)" \
        -v added50="$(printf '%s\n' ${added50[@]+"${added50[@]}"} | median)" \
        -v f="$ALLOW_P50" -v fname="$ALLOW_NAME" -v fdata="${DIRECT_P50:+$FSYNC_P50}" \
        -v fr99="$(printf '%s\n' ${d99s[@]+"${d99s[@]}"} | median)" '
        # The verdict on a median figure against its limit: over it is MISSED whatever bare
        # did; under it is NOT MET if a gateway run failed (its round left out), else MET only
        # if bare'"'"'s floor came from a punctual run.
        function failed() { return sprintf("NOT MET (%d gateway run(s) failed)", gw_invalid) }
        function verdict_at(a, limit) {
            if (a > limit) return "MISSED"
            if (gw_invalid > 0) return failed()
            if (bare_late != "") return "INCONCLUSIVE (the lowest bare p99 is round " bare_r \
                "'"'"'s, whose generator ran late: " bare_late ")"
            return "MET"
        }
        function verdict(a) { return verdict_at(a, 1000 + f) }
        BEGIN {
            allow = sprintf("added p99 <= 1 ms + one fsync p50 (%s: %d us%s) = %d us", fname, f,
                (fdata == "" ? "" : sprintf("; write + fdatasync: %d us", fdata)), 1000 + f)
            all_rounds = (n_all == 0 ? "no valid round" : sprintf("%d valid round(s) of %d, none dropped: added p99 median %d us: %s",
                n_all, rounds, added_all, verdict(added_all)))
            if (n == 0) {
                printf "open loop %s req/s: no round counted of %d (added p99 per round: %s)\n",
                    rate, rounds, (per == "" ? "none" : per)
                printf "target: %s: %s [over all rounds: %s]\n", allow,
                    (gw_invalid > 0 ? failed() : "INCONCLUSIVE"), all_rounds
                exit
            }
            printf "open loop %s req/s: gateway p50 %d us, p99 %d us; bare (lowest of %d run(s)) p50 %d us, p99 %d us" \
                " (round %s); gateway-added p50 %d us, p99 %d us", rate, g50, g99, bare_n, b50, b99, bare_r,
                added50, added
            if (rounds > 1) printf " (medians of %d counted round(s) of %d; added p99 per round: %s)", n, rounds, per
            printf "\n"
            printf "target: %s: %s [over all rounds: %s]\n", allow, verdict(added), all_rounds
            printf "        (against 1 ms + the disk'"'"'s own p99 at %s/s, paced fsync in the same round:\n", rate
            printf "        %s us, median %d us; added p99 less the disk'"'"'s, median %d us: %s)\n",
                disk_per, fr99, over, verdict_at(over, 1000) }'
    echo "target: gateway >= 0.50 x bare req/s at 16 connections: ${C16:-n/a (16 not among CONNECTIONS)}"
    echo "        (each reserve's hand-off to the owner and back, between bare threads: p50 $HANDOFF_P50 us;" \
        "one fsync: write + fdatasync p50 $FSYNC_P50 us, direct write p50 ${DIRECT_P50:-n/a} us)"
    # CPU, not time: what one durable write costs its writer (nearly all in the kernel; on
    # a VM, likely exits to the hypervisor), next to what a whole bare response costs. The
    # gateway pays the write once per batch of reserves.
    # The rounds counted in the 16-connection row only (both runs exited 0), as its ratio:
    # a failed run's served answers are not all it answered.
    # cpu16 FILES...: the median of the .cpu files that exist, "N us", or n/a.
    cpu16() {
        local v=
        [ $# -eq 0 ] || v=$(cat "$@" 2>/dev/null || true)
        if [ -n "$v" ]; then echo "$(median <<<"$v") us"; else echo n/a; fi
    }
    if [ -n "${C16:-}" ]; then
        echo "        (CPU per response at 16 connections, the rounds counted above: bare" \
            "$(cpu16 ${cpu16_bare[@]+"${cpu16_bare[@]}"}), gateway $(cpu16 ${cpu16_gw[@]+"${cpu16_gw[@]}"});" \
            "one durable write: ${SYNC_CPU:-?} us of its writer's CPU)"
    fi
fi
if [ "$MAIN" = 1 ]; then
    if [ "$MUTEX_BENCH" = 1 ] && [ -f benches/mutex.rs ]; then
        echo "-- cargo bench --bench mutex"
        HOOX_BENCH_DIR="$WORK/state" timeout 900 cargo bench --bench mutex ${BUILD[@]+"${BUILD[@]}"} 2>&1 | grep -v '^\s*\(Compiling\|Finished\|Running\)' |
            tail -n 40 || true
    fi
fi

if [ "$STORM" = 1 ] || [ "$CHAOS" = 1 ]; then
    start ledger "ledger on" "$BIN/hoox-load" ledger --listen "127.0.0.1:$LEDGER_PORT"
    LEDGER="http://127.0.0.1:$LEDGER_PORT/ledger"
fi

# ledger_total: the orders the ledger has counted, or nothing if it did not answer. Never
# fails: check-ledger exits 1 when a key was forwarded twice, and the verdict that follows
# must still be printed (set -e would end the script here).
ledger_total() {
    { "$BIN/hoox-load" check-ledger --ledger "$LEDGER" --json 2>/dev/null || true; } |
        grep -o '"total":[0-9]*' | cut -d: -f2 || true
}

# namespace_doubles NAME PREFIX: sets NS_KEYS (how many of the run's client keys, those
# hoox-load made with --key-prefix PREFIX, the ledger has taken) and NS_WHY (why they fail,
# or nothing). check-ledger counts doubles of the key as the gateway forwards it,
# `client:{identity}:{mode}:{key}`: the same client key forwarded again under another
# identity or mode is two keys to it. The harness sends one identity, live mode only, so
# with that namespace stripped each of the run's keys must appear once. Only the run's own
# keys count: another run's (the storm's, in the chaos check), or the same key sent under
# another identity or mode by anyone else, is legitimately another order. The ledger's keys
# are kept in $WORK/ledger-keys-NAME.
namespace_doubles() {
    local keys="$WORK/ledger-keys-$1" n
    NS_KEYS='?' NS_WHY=''
    rm -f "$keys"
    "$BIN/hoox-load" check-ledger --ledger "$LEDGER" --write-keys "$keys" >/dev/null 2>&1 || true
    if [ ! -f "$keys" ]; then
        NS_WHY="the ledger did not list its keys"
        return 0
    fi
    awk -v p="$2-" 'sub(/^client:[^:]*:[^:]*:/, "") && index($0, p) == 1' "$keys" |
        sort >"$keys.stripped"
    NS_KEYS=$(wc -l <"$keys.stripped")
    uniq -d "$keys.stripped" >"$keys.doubles"
    n=$(wc -l <"$keys.doubles")
    if [ "$n" -gt 0 ]; then
        NS_WHY="$n client keys forwarded under more than one namespace: $(head -n 3 "$keys.doubles" | paste -sd ' ')"
    fi
}

# verdict NAME REASONS...: NAME: OK, or NAME: FAIL with the reasons (and FAILED=1).
verdict() {
    local name=$1
    shift
    if [ $# -eq 0 ]; then
        echo "$name: OK"
    else
        echo "$name: FAIL: $(printf '%s; ' "$@" | sed 's/; $//')"
        FAILED=1
    fi
}

if [ "$STORM" = 1 ]; then
    echo "-- storm: $STORM_CONNECTIONS connections, $STORM_KEYS keys, ${STORM_S}s, http executor -> ledger"
    gateway_config "$WORK/state/storm" http
    start_gateway "$WORK/state/storm"
    before=$(ledger_total)
    storm_prefix="storm-$$"
    load storm "$GW_PORT" --connections "$STORM_CONNECTIONS" --duration "${STORM_S}s" \
        --keys "$STORM_KEYS" --key-prefix "$storm_prefix"
    stop "$GW_PID"
    after=$(ledger_total)
    # Every key is drawn in the run's first moments, so each must be forwarded exactly once:
    # fewer means orders lost (or a gateway that forwarded nothing), more a key forwarded twice.
    reasons=()
    if [ -z "$before" ] || [ -z "$after" ]; then
        reasons+=("the ledger did not answer")
        forwarded="?"
    else
        forwarded=$((after - before))
        [ "$forwarded" -eq "$STORM_KEYS" ] || reasons+=("forwarded $forwarded, not $STORM_KEYS")
    fi
    [ "$LOAD_RC" = 0 ] || reasons+=("hoox-load exited $LOAD_RC")
    "$BIN/hoox-load" check-ledger --ledger "$LEDGER" >"$WORK/storm-ledger.txt" 2>&1 ||
        reasons+=("$(grep -h FAIL "$WORK/storm-ledger.txt" | paste -sd ' ' || true)")
    namespace_doubles storm "$storm_prefix"
    [ -z "$NS_WHY" ] || reasons+=("$NS_WHY")
    echo "  storm: $forwarded orders forwarded for $STORM_KEYS keys; ledger, namespace stripped:" \
        "$NS_KEYS of the storm's client keys${NS_WHY:+: $NS_WHY}"
    verdict storm ${reasons[@]+"${reasons[@]}"}
fi

if [ "$CHAOS" = 1 ]; then
    echo "-- chaos: $CHAOS_ROUNDS x SIGKILL under load ($CHAOS_CONNECTIONS connections, dup ratio $CHAOS_DUP)," \
        "and one more once it ends, before the replay"
    gateway_config "$WORK/state/chaos" http
    start_gateway "$WORK/state/chaos"
    prefix="chaos-$$"
    before=$(ledger_total)
    ok_keys="$WORK/chaos-2xx-keys"
    : >"$ok_keys"
    # One load across every crash: its connections reconnect, and a share of its requests
    # repeat earlier keys, some of them in flight when the gateway died. Failed requests are
    # the point here (--expect-errors); every key answered 2xx is written down for the replay.
    timeout 900 "$BIN/hoox-load" run --url "https://127.0.0.1:$GW_PORT/webhook" \
        --ca "$WORK/tls/cert.pem" "--$PROTOCOL" --auth "$AUTH" --secret-file "$WORK/secrets/token" \
        --connections "$CHAOS_CONNECTIONS" --duration "$((CHAOS_ROUNDS * 3 + 3))s" \
        --dup-ratio "$CHAOS_DUP" --key-prefix "$prefix" --timeout 3s --json \
        --expect-errors --write-2xx-keys "$ok_keys" >"$WORK/chaos-load.json" 2>&1 &
    LOAD_PID=$!
    PIDS+=("$LOAD_PID")
    for round in $(seq "$CHAOS_ROUNDS"); do
        ms=$((RANDOM % 2200 + 300))
        sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
        stop "$GW_PID" KILL
        echo "  round $round: SIGKILL after ${ms} ms, restarting"
        start_gateway "$WORK/state/chaos"
    done
    chaos_rc=0
    wait "$LOAD_PID" || chaos_rc=$?
    forget "$LOAD_PID"
    # The kills fit in the load's first part: the last gateway served until it ended, and the
    # keys it answered crossed no crash. One more SIGKILL, and a restart, before the replay.
    stop "$GW_PID" KILL
    echo "  after the load: SIGKILL, restarting, so that every key replayed below crossed a SIGKILL"
    start_gateway "$WORK/state/chaos"
    ok2xx=$(grep -o '"status":{[^}]*}' "$WORK/chaos-load.json" | grep -o '"2[0-9][0-9]":[0-9]*' |
        cut -d: -f2 | awk '{ n += $1 } END { print n + 0 }' || true)
    echo "  load: $(grep -o '"status":{[^}]*}' "$WORK/chaos-load.json" | cut -c10-)" \
        "errors $(grep -o '"errors":{[^}]*}' "$WORK/chaos-load.json" | cut -c10-)"
    reasons=()
    # Each 2xx written down once: a key answered 2xx twice was placed twice (or said so).
    sort "$ok_keys" | uniq -d >"$ok_keys.twice"
    [ "$(wc -l <"$ok_keys")" -eq "$ok2xx" ] ||
        reasons+=("$(wc -l <"$ok_keys") keys written for $ok2xx answers 2xx")
    [ ! -s "$ok_keys.twice" ] ||
        reasons+=("$(wc -l <"$ok_keys.twice") keys answered 2xx twice: $(head -n 3 "$ok_keys.twice" | paste -sd ' ')")
    sort -u "$ok_keys" >"$ok_keys.unique"
    # The keys the executor took in this run, as the client sent them (the gateway forwards
    # `client:{identity}:{mode}:{key}`): orders a killed gateway forwarded and never
    # answered are among them, held pending after the restart, and replayed too. Each key
    # answered 2xx must be there: a 2xx for an order the executor never got is a lie.
    : >"$WORK/ledger-keys"
    "$BIN/hoox-load" check-ledger --ledger "$LEDGER" --write-keys "$WORK/ledger-keys" \
        >/dev/null 2>&1 || true
    sed -n "s/^client:[^:]*:[^:]*:\($prefix-\)/\1/p" "$WORK/ledger-keys" 2>/dev/null |
        sort -u >"$WORK/chaos-forwarded-keys"
    never=$(comm -23 "$ok_keys.unique" "$WORK/chaos-forwarded-keys" | wc -l)
    [ "$never" -eq 0 ] || reasons+=("$never keys answered 2xx never reached the executor")
    comm -13 "$ok_keys.unique" "$WORK/chaos-forwarded-keys" >"$WORK/chaos-unanswered-keys"
    unanswered=$(wc -l <"$WORK/chaos-unanswered-keys")
    # After the last restart, calmly, every key that reached the executor unanswered, and
    # every key that got a 2xx (or, past CHAOS_REPLAY keys in all, a uniform random sample
    # of those): whatever was pending at a crash, each must be refused as a duplicate
    # (409), and none forwarded again.
    cp "$WORK/chaos-unanswered-keys" "$WORK/chaos-replay-keys"
    room=$((CHAOS_REPLAY > unanswered ? CHAOS_REPLAY - unanswered : 0))
    if [ "$(wc -l <"$ok_keys.unique")" -gt "$room" ]; then
        shuf -n "$room" "$ok_keys.unique" >>"$WORK/chaos-replay-keys"
    else
        cat "$ok_keys.unique" >>"$WORK/chaos-replay-keys"
    fi
    replayed=$(wc -l <"$WORK/chaos-replay-keys")
    if [ "$replayed" -gt 0 ]; then
        echo "  replaying $replayed keys: the $unanswered forwarded unanswered, and" \
            "$((replayed - unanswered)) of the $(wc -l <"$ok_keys.unique") answered 2xx"
        load chaos-replay "$GW_PORT" --connections 4 --replay-keys "$WORK/chaos-replay-keys"
        refused=$(jget "$WORK/chaos-replay.json" 409)
        [ "${refused:-0}" -eq "$replayed" ] && [ "$LOAD_RC" = 0 ] ||
            reasons+=("replay: ${refused:-0} x 409 for $replayed keys (hoox-load exited $LOAD_RC)")
    else
        reasons+=("no key to replay")
    fi
    after=$(ledger_total)
    stop "$GW_PID"
    if [ -z "$before" ] || [ -z "$after" ]; then
        reasons+=("the ledger did not answer")
    elif [ "$((after - before))" -lt 1 ]; then
        reasons+=("no order forwarded")
    else
        echo "  ledger: $((after - before)) orders forwarded during the chaos run"
    fi
    [ "$ok2xx" -ge 1 ] || reasons+=("no answer 2xx")
    # With --expect-errors only a run with no answer at all (3), one that could not run (2) or
    # the timeout (124) exits nonzero.
    [ "$chaos_rc" = 0 ] || reasons+=("the chaos load exited $chaos_rc")
    "$BIN/hoox-load" check-ledger --ledger "$LEDGER" || reasons+=("ledger check failed")
    namespace_doubles chaos "$prefix"
    [ -z "$NS_WHY" ] || reasons+=("$NS_WHY")
    echo "  ledger, namespace stripped (the client's own key): $NS_KEYS of the chaos run's client keys," \
        "${NS_WHY:-each forwarded once}"
    verdict chaos ${reasons[@]+"${reasons[@]}"}
fi

# proof_test NAME ENV=VALUE: CI's tests/NAME.rs against the real binary, with the longer
# count ENV sets; its own assertions decide.
proof_test() {
    local name=$1 count=$2 log="$WORK/test-$1.log"
    echo "-- tests/$name.rs, $count"
    if env "$count" timeout 1200 cargo test --release --locked --test "$name" >"$log" 2>&1; then
        echo "$name test: OK, $(grep -o 'finished in [0-9.]*s' "$log" | tail -n 1)"
    else
        echo "$name test: FAIL (log: $log)"
        tail -n 40 "$log"
        FAILED=1
    fi
}
if [ "$STORM" = 1 ]; then proof_test storm "HOOX_STORM_TRIALS=$STORM_TRIALS"; fi
if [ "$CHAOS" = 1 ]; then proof_test chaos "HOOX_CHAOS_CYCLES=$CHAOS_CYCLES"; fi

exit "$FAILED"
