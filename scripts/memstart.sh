#!/usr/bin/env bash
# scripts/memstart.sh: how much memory does the gateway hold, and how fast is it back?
#
#   idle RSS after READY=1 on an empty store; peak RSS after KEYS unique live keys
#   (paper executor, [store] ttl = "1h", [limits] capacity = 200000, state on the local
#   disk); then ROUNDS x (SIGTERM, restart on the same state): time from exec to READY=1
#   and RSS once the index of KEYS keys is rebuilt. Medians over the rounds. Binary sizes
#   (x86_64 gnu, and musl if already built).
#
# Targets (issue): idle <= 20 MB, with 100k live keys <= 80 MB, start to READY <= 1 s.
#
# Everything listens on 127.0.0.1, every process started here is killed by PID on exit,
# every step is bounded in time. Knobs (environment):
#   KEYS=100000  ROUNDS=5  CONNECTIONS=64  PORT_BASE=18470 (uses PORT_BASE..+1)
#   MEM_DIR (state; default a fresh folder in /var/tmp, the local disk)  KEEP=1 (keep it)
#   SKIP_BUILD=1  GATEWAY=path/to/hoox-edge (measure another build)
#   TARGET=x86_64-unknown-linux-musl (build and measure that target; default: the host build,
#     on which the memory targets were first measured)
#
#   scripts/memstart.sh --alloc BIN_A BIN_B ...   compare builds (e.g. musl malloc vs
#       mimalloc): ROUNDS x, binaries interleaved within each round so the shared machine's
#       drift hits all alike: fresh state on tmpfs (ALLOC_DIR=/dev/shm) so the disk does not
#       dominate, paper executor, [limits] capacity = 1000000, and for each run a fresh store
#       and gateway: idle RSS, then hoox-load for ALLOC_S=10 s at each of
#       ALLOC_CONNECTIONS="16 64" (HTTP/1.1, unique keys). Prints req/s, p50/p99 and VmHWM
#       per run and the medians per binary; fails if any answer is not 200.
set -euo pipefail

ALLOC=()
if [ "${1:-}" = --alloc ]; then
    shift
    ALLOC=("$@")
    [ ${#ALLOC[@]} -gt 0 ] || { echo "memstart.sh: --alloc needs binaries" >&2; exit 64; }
    SKIP_BUILD=1
    MEM_DIR=${MEM_DIR:-$(mktemp -d "${ALLOC_DIR:-/dev/shm}/hoox-alloc.XXXXXX")}
elif [ $# -gt 0 ]; then
    sed -n '2,26p' "$0"
    exit 64
fi

KEYS=${KEYS:-100000}
ROUNDS=${ROUNDS:-5}
CONNECTIONS=${CONNECTIONS:-64}
PORT_BASE=${PORT_BASE:-18470}
GW_PORT=$PORT_BASE
ADMIN_PORT=$((PORT_BASE + 1))

cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
TDIR=${CARGO_TARGET_DIR:-target}
select_build
GATEWAY=${GATEWAY:-$BIN/hoox-edge}
for b in "$GATEWAY" "$BIN/hoox-load"; do
    [ -x "$b" ] || { echo "memstart.sh: $b not built" >&2; exit 1; }
done

work_in "${MEM_DIR:-$(mktemp -d /var/tmp/hoox-memstart.XXXXXX)}"

# A Ctrl-C (or SIGTERM) while start_ready waits: timeout puts the launcher in a process group
# of its own, which the terminal's SIGINT does not reach, and bash runs the trap only once the
# launcher is done, then exits before start_ready adds the gateway it started to PIDS. So the
# trap takes the gateway's PID from gw.pid, which the launcher writes as soon as it has
# started it, and which start_ready removes once that PID is in PIDS: never a PID that
# stop_gateway already stopped (and that another process may have by now).
adopt_launched() {
    local pid p
    [ -s "$WORK/gw.pid" ] || return 0
    pid=$(cat "$WORK/gw.pid")
    for p in ${PIDS[@]+"${PIDS[@]}"}; do [ "$p" != "$pid" ] || return 0; done
    PIDS+=("$pid")
}
trap 'adopt_launched; exit 130' INT TERM

# start_ready NAME: exec the gateway with NOTIFY_SOCKET set to a datagram socket we bind,
# and wait (60 s at most) for READY=1. Sets GW_PID and READY_MS (exec to READY=1). The
# gateway polls its owner every 100 ms until ready, so READY_MS is at most 100 ms late.
start_ready() {
    local out
    rm -f "$WORK/notify.sock" "$WORK/gw.pid"
    if ! out=$(timeout 70 python3 - "$WORK/notify.sock" "$WORK/gw.pid" "$WORK/$1.log" \
        "$GATEWAY" serve --config "$WORK/config.toml" <<'EOF'
import os, socket, subprocess, sys, time
sock_path, pid_file, log_path, cmd = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sock_path)
env = dict(os.environ, NOTIFY_SOCKET=sock_path)
env.pop("WATCHDOG_USEC", None)
log = open(log_path, "w")
t0 = time.monotonic()
p = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, stdin=subprocess.DEVNULL)
with open(pid_file, "w") as f:
    f.write(str(p.pid))
s.settimeout(0.05)
while time.monotonic() - t0 < 60:
    try:
        msg = s.recv(4096).decode(errors="replace")
    except socket.timeout:
        if p.poll() is not None:
            sys.exit(f"gateway exited with {p.returncode} before READY=1")
        continue
    if "READY=1" in msg.split("\n"):
        print(f"{p.pid} {(time.monotonic() - t0) * 1000:.0f}")
        sys.exit(0)
sys.exit("no READY=1 within 60 s")
EOF
    ); then
        adopt_launched
        echo "memstart.sh: gateway did not get ready:" >&2
        tail -n 20 "$WORK/$1.log" >&2
        exit 1
    fi
    GW_PID=${out% *}
    READY_MS=${out#* }
    PIDS+=("$GW_PID")
    rm -f "$WORK/gw.pid"
}

# stop_gateway: SIGTERM, and wait (30 s at most) until it has exited. It is not our child (the
# python launcher exited), so poll its state instead of `wait`: `running` (scripts/lib.sh),
# for which an exited gateway no one has reaped yet (a zombie) is gone.
stop_gateway() {
    kill -TERM "$GW_PID" 2>/dev/null || true
    for _ in $(seq 300); do
        running "$GW_PID" || break
        sleep 0.1
    done
    if running "$GW_PID"; then
        echo "memstart.sh: gateway $GW_PID did not stop on SIGTERM" >&2
        exit 1
    fi
    local keep=() pid
    for pid in "${PIDS[@]}"; do [ "$pid" = "$GW_PID" ] || keep+=("$pid"); done
    PIDS=(${keep[@]+"${keep[@]}"})
}

# mem FIELD: a /proc/GW_PID/status field in MB, 10^6 bytes, as the targets are (the kernel's
# "kB" are KiB: × 1024 / 10^6). Until 2026-12-06 this printed MiB as MB, 4.6% less.
mem() {
    awk -v f="$1:" '$1 == f { printf "%.1f", $2 * 1024 / 1e6 }' "/proc/$GW_PID/status"
}
# rollup FIELD: the same from smaps_rollup (Anonymous, Rss, Private_Dirty, ...).
rollup() {
    awk -v f="$1:" '$1 == f { printf "%.1f", $2 * 1024 / 1e6 }' "/proc/$GW_PID/smaps_rollup"
}
live_keys() {
    curl -s --max-time 5 "http://127.0.0.1:$ADMIN_PORT/metrics" |
        awk '$1 == "hoox_mutex_live_keys" { print $2 }'
}
snapshot() {
    printf '  %-26s VmHWM %6s MB  VmRSS %6s MB  (anon %s MB, file %s MB)  live keys %s\n' "$1" \
        "$(mem VmHWM)" "$(mem VmRSS)" "$(mem RssAnon)" "$(mem RssFile)" "$(live_keys)"
}
median() {
    sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

"$BIN/hoox-load" gen-cert --dir "$WORK/tls" >/dev/null
mkdir -p "$WORK/secrets" "$WORK/state"
chmod 700 "$WORK/secrets"
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/secrets/token")
{
    printf '[server]\nlisten = "127.0.0.1:%s"\ncert = "%s"\nkey = "%s"\n' \
        "$GW_PORT" "$WORK/tls/cert.pem" "$WORK/tls/key.pem"
    # shellcheck disable=SC2086 # lists of counts
    server_limits "$CONNECTIONS" ${ALLOC_CONNECTIONS:-16 64}
    echo
    printf '[admin]\nlisten = "127.0.0.1:%s"\n\n' "$ADMIN_PORT"
    printf '[store]\npath = "%s"\nttl = "1h"\n\n' "$WORK/state/mutex.redb"
    # Room for the fill; the allocator runs, each on a fresh store, take the default, which
    # no run of ALLOC_S at this machine's rates fills.
    if [ ${#ALLOC[@]} -gt 0 ]; then
        printf '[limits]\ncapacity = 1000000\n\n'
    else
        printf '[limits]\ncapacity = 200000\n\n'
    fi
    printf '[auth]\nbearer_tokens_file = "%s"\n\n' "$WORK/secrets/token"
    printf '[executor]\nkind = "paper"\n'
} >"$WORK/config.toml"

# jget FILE FIELD: a number from hoox-load's one-line JSON (field names are unique in it).
jget() {
    { grep -o "\"$2\":[-0-9.e+]*" "$1" 2>/dev/null || true; } | head -n 1 | cut -d: -f2
}

if [ ${#ALLOC[@]} -gt 0 ]; then
    ALLOC_S=${ALLOC_S:-10}
    ALLOC_CONNECTIONS=${ALLOC_CONNECTIONS:-"16 64"}
    echo "== allocator comparison, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, state on" \
        "$(df -T "$WORK" | awk 'NR == 2 { print $2 }'), ${ALLOC_S}s per run, $ROUNDS rounds"
    : >"$WORK/alloc.tsv"
    for round in $(seq "$ROUNDS"); do
        echo "-- round $round, $(uptime | sed 's/.*load average/load average/')"
        for i in "${!ALLOC[@]}"; do
            GATEWAY=${ALLOC[$i]}
            for c in $ALLOC_CONNECTIONS; do
                # A fresh store for each run: the keys of the one before (a 1 h TTL) would
                # fill it, and a gateway refusing at capacity is measured answering 503s.
                rm -rf "$WORK/state" && mkdir -p "$WORK/state"
                start_ready "alloc-$i-$round-$c"
                sleep 1
                idle=$(mem VmRSS)
                timeout 120 "$BIN/hoox-load" run --url "https://127.0.0.1:$GW_PORT/webhook" \
                    --ca "$WORK/tls/cert.pem" --http1 --auth bearer --secret-file "$WORK/secrets/token" \
                    --connections "$c" --duration "${ALLOC_S}s" --key-prefix "alloc-$$-$round-$i-$c" \
                    --json >"$WORK/run.json" || true
                # Only 200s: a refusal answers fast, and its req/s and latency are not the
                # allocator's.
                status=$(grep -o '"status":{[^}]*}' "$WORK/run.json" || true)
                if ! [[ $status =~ ^\"status\":\{\"200\":[0-9]+\}$ ]]; then
                    echo "memstart: $GATEWAY at $c connections answered other than 200 ($status)" >&2
                    exit 1
                fi
                rps=$(jget "$WORK/run.json" throughput_rps)
                p50=$(jget "$WORK/run.json" p50) p99=$(jget "$WORK/run.json" p99)
                printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$i" "$c" "$rps" "$p50" "$p99" "$idle" >>"$WORK/alloc.tsv"
                printf '  %-60s c%-3s %7.0f req/s  p50 %6s us  p99 %6s us  idle RSS %s MB  VmHWM %s MB\n' \
                    "$GATEWAY" "$c" "$rps" "$p50" "$p99" "$idle" "$(mem VmHWM)"
                stop_gateway
            done
        done
    done
    echo
    echo "| build | connections | req/s (median) | p50 us (median) | p99 us (median) | idle RSS MB (median) |"
    echo "|---|---|---|---|---|---|"
    for i in "${!ALLOC[@]}"; do
        for c in $ALLOC_CONNECTIONS; do
            col() { awk -F'\t' -v i="$i" -v c="$c" -v k="$1" '$1 == i && $2 == c { print $k }' "$WORK/alloc.tsv" | median; }
            printf '| %s | %s | %.0f | %s | %s | %s |\n' "${ALLOC[$i]}" "$c" "$(col 3)" "$(col 4)" "$(col 5)" "$(col 6)"
        done
    done
    exit 0
fi

FS=$(df -T "$WORK" | awk 'NR == 2 { print $2 " on " $1 }')
echo "== hoox-edge memory and start, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores," \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), state on $FS"
echo "   gateway $GATEWAY, $KEYS keys, $ROUNDS restarts, load: $(uptime | sed 's/.*load average/load average/')"

echo "-- binary sizes"
for b in "$TDIR/release/hoox-edge" "$TDIR/x86_64-unknown-linux-musl/release/hoox-edge" \
    "$TDIR/aarch64-unknown-linux-musl/release/hoox-edge"; do
    [ -x "$b" ] || continue
    strip -o "$WORK/stripped" "$b" 2>/dev/null || cp "$b" "$WORK/stripped"
    printf '  %-60s %9d bytes (%.2f MiB), after strip %9d bytes\n' "$b" "$(stat -c %s "$b")" \
        "$(stat -c %s "$b" | awk '{ print $1 / 1048576 }')" "$(stat -c %s "$WORK/stripped")"
    rm -f "$WORK/stripped"
done

echo "-- first start, empty store"
start_ready first
echo "  exec to READY=1: $READY_MS ms"
sleep 1
IDLE_HWM=$(mem VmHWM) IDLE_RSS=$(mem VmRSS)
snapshot "idle"

echo "-- fill: $KEYS unique keys, $CONNECTIONS connections, HTTP/1.1"
timeout 900 "$BIN/hoox-load" run --url "https://127.0.0.1:$GW_PORT/webhook" --ca "$WORK/tls/cert.pem" \
    --http1 --auth bearer --secret-file "$WORK/secrets/token" --connections "$CONNECTIONS" \
    --requests "$KEYS" --key-prefix "memstart-$$" --json >"$WORK/fill.json" || true
STATUS=$(grep -o '"status":{[^}]*}' "$WORK/fill.json")
echo "  $(grep -o '"throughput_rps":[0-9.]*' "$WORK/fill.json") $STATUS"
# The figures below are for KEYS live keys: a fill that was refused in part measured fewer.
if [ "$STATUS" != "\"status\":{\"200\":$KEYS}" ]; then
    echo "memstart: the fill was not $KEYS answers of 200 ($STATUS)" >&2
    exit 1
fi
sleep 1
snapshot "after fill"
FILL_HWM=$(mem VmHWM)
stop_gateway
echo "  database file: $(stat -c %s "$WORK/state/mutex.redb") bytes"

echo "-- $ROUNDS x (SIGTERM, restart on the same state)"
: >"$WORK/ready_ms" && : >"$WORK/hwm" && : >"$WORK/rss"
for round in $(seq "$ROUNDS"); do
    start_ready "restart-$round"
    sleep 1
    echo "$READY_MS" >>"$WORK/ready_ms"
    mem VmHWM >>"$WORK/hwm" && echo >>"$WORK/hwm"
    mem VmRSS >>"$WORK/rss" && echo >>"$WORK/rss"
    snapshot "restart $round: ${READY_MS} ms"
    stop_gateway
done

echo
echo "| measure | value | target |"
echo "|---|---|---|"
echo "| idle, empty store: VmHWM / VmRSS | $IDLE_HWM / $IDLE_RSS MB | <= 20 MB |"
echo "| after $KEYS keys: VmHWM (peak) | $FILL_HWM MB | <= 80 MB |"
echo "| restart on $KEYS keys: VmHWM / VmRSS (median) | $(median <"$WORK/hwm") / $(median <"$WORK/rss") MB | <= 80 MB |"
echo "| restart on $KEYS keys: exec to READY=1 (median of $ROUNDS; $(sort -n "$WORK/ready_ms" | tr '\n' ' ')ms) | $(median <"$WORK/ready_ms") ms | <= 1000 ms |"
