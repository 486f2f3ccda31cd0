#!/usr/bin/env bash
# Runs every fuzz target for a bounded time and fails on the first crash found.
#   FUZZ_SECONDS  time per target (default 20)
#   FUZZ_TARGETS  space-separated targets (default: all of them)
#   FUZZ_QUICK=1  build for a short run: cargo fuzz's dev mode at opt-level 1, no debug
#                 info, no sanitizer. Measured on 2026-12-02, from empty: the build 247 s,
#                 against 288 s in release mode at opt-level 1 (286 s in CI; the same with
#                 `--codegen-units 16`), and as many runs per 10 s (webhook_body 511k
#                 against 492k; at opt-level 0, 39k). Dev mode also keeps debug
#                 assertions and overflow checks on, which a short run wants. The targets
#                 reach no unsafe code of ours, so a bug there shows as a panic, which
#                 libFuzzer catches without AddressSanitizer.
#                 Default 0: cargo fuzz's own (optimised, AddressSanitizer), for long runs.
#   CARGO_TARGET_DIR  honoured: fuzz builds go to $CARGO_TARGET_DIR/fuzz
# A crash leaves its input in fuzz/artifacts/<target>/; reproduce it with
#   cargo +nightly fuzz run <target> fuzz/artifacts/<target>/<file>
# and make it a unit test before fixing it.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${FUZZ_SECONDS:-20}"
targets="${FUZZ_TARGETS:-webhook_body idem_header key_fingerprint hmac_header entry_decode}"

# What it needs, installed if missing: a nightly toolchain (cargo fuzz builds with
# sanitizer flags only nightly takes), a C++ compiler (libfuzzer-sys builds libFuzzer), and
# cargo-fuzz itself (--debug: it only drives cargo and libFuzzer, so its own speed does not
# matter; its build does). Pinned, so that a new release cannot break CI by needing a newer
# Rust than the stable toolchain it is built with (cargo install builds with the default
# toolchain, not nightly); a machine that has another version gets this one (--force: also
# over a cargo-fuzz cargo did not install).
cargo_fuzz_version=0.13.2
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal
fi
if ! command -v c++ >/dev/null; then
    { apt-get update -qq && apt-get install -y -qq g++ >/dev/null; } ||
        { echo "fuzz: no C++ compiler, and g++ could not be installed (root, apt)" >&2; exit 1; }
fi
if [[ " $(cargo +nightly fuzz --version 2>/dev/null || true) " != *" $cargo_fuzz_version "* ]]; then
    cargo install "cargo-fuzz@$cargo_fuzz_version" --locked --debug --force
fi

dir_args=()
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
    dir_args=(--target-dir "$CARGO_TARGET_DIR/fuzz")
fi
if [ "${FUZZ_QUICK:-0}" = 1 ]; then
    export CARGO_PROFILE_DEV_OPT_LEVEL=1 CARGO_PROFILE_DEV_DEBUG=false
    dir_args+=(--dev --sanitizer none)
fi

# Built first, apart: a target that does not build is not a crash.
for t in $targets; do
    cargo +nightly fuzz build "${dir_args[@]}" "$t" || {
        echo "fuzz: $t does not build" >&2
        exit 1
    }
done

failed=()
for t in $targets; do
    corpus="fuzz/corpus/$t"
    mkdir -p "$corpus"
    # New inputs go to the first directory; the committed seeds stay untouched.
    dirs=("$corpus")
    if [ -d "fuzz/seeds/$t" ]; then dirs+=("fuzz/seeds/$t"); fi
    echo "== $t: ${secs}s"
    if ! cargo +nightly fuzz run "${dir_args[@]}" "$t" "${dirs[@]}" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1; then
        failed+=("$t")
    fi
done

if [ "${#failed[@]}" -ne 0 ]; then
    echo "fuzz: crashes in: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz: no crash in: $targets"
