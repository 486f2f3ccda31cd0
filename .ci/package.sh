#!/usr/bin/env bash
# Build, check and package hoox-edge for amd64 and arm64 (SPEC §5), from a fresh Debian 12
# machine as root. Idempotent: tools already present are not reinstalled, the scratch Debian
# root is cached, and every run leaves that root as it found it.
#
#   bash .ci/package.sh            # everything
#   SKIP_INSTALL_TEST=1 bash ...   # no debootstrap root (its first creation takes minutes)
#
# What it checks, in order; any failure stops the script with a non-zero exit:
#   1. both musl release binaries build (aarch64 with Debian's gcc-aarch64-linux-gnu, which
#      also compiles ring's C and assembly);
#   2. `file` sees each as static (no interpreter) and of the right architecture; sizes printed;
#   3. smoke_aarch64: the arm64 binary runs under qemu-aarch64-static (`--version`, and a
#      short serve on a temp state dir whose curl line places an order, then gets a 409,
#      and exits 0 within 40 s of SIGTERM);
#      test_aarch64: the unit tests and the mutex's basic, concurrency, crash and fault
#      tests, built for aarch64, pass under it (cargo-nextest, each test its own process);
#   4. the systemd unit: `systemd-analyze verify`, warnings included; ordered after
#      time-sync.target; no ProcSubset= (it would hide the boot id); `systemd-analyze
#      security --offline` exposure at most $MAX_EXPOSURE;
#   5. both .debs: control fields (Package, Version, Architecture amd64/arm64), contents
#      (binary of the right architecture, unit, conffile, doc), conffiles list, and that the
#      maintainer scripts carry the generated systemd snippets;
#   6. install_test: the amd64 .deb installed with dpkg in a debootstrapped Debian 12 root
#      (chroot): user, directories and modes, generated secrets, conffile, unit enabled; then
#      reinstall keeps the secret; a config the new binary refuses fails the install
#      (half-configured) until fixed, and so does a key.pem only root may read (the check
#      runs as the service's user), and so does a deleted config.toml, and so does the
#      package's paper config.toml put in place of an http one by an upgrade (--force-confnew;
#      without systemd and where it runs, a stub systemctl; --force-confold keeps it, without
#      a terminal); an install stopped while it made a secret is finished by `dpkg
#      --configure -a`; a login account
#      named hoox-edge is not taken over; an upgrade restarts the service only if it runs
#      and a first install starts it (a stub systemctl); remove keeps config; purge removes
#      config, secrets, certificates, state and user, saying so, empties a store folder that is a mount
#      point, and leaves an operator's own file in /etc/hoox-edge on root's group.
set -euo pipefail

cd "$(dirname "$0")/.."
source .ci/order.sh
ROOT=$PWD
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$CARGO_TARGET_DIR/debian
CHROOT=${HOOX_CI_CHROOT:-/var/cache/hoox-edge-ci/bookworm-amd64}
MAX_EXPOSURE=1.2
UNIT=systemd/hoox-edge.service
TARGETS=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
CARGO_DEB_VERSION=3.8.0

# ring builds C and assembly for the target: Debian's cross gcc does it for aarch64 (musl
# needs no target libc from gcc: Rust's musl targets bring their own crt and libc.a), and
# musl-gcc for x86_64.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc
export AR_aarch64_unknown_linux_musl=aarch64-linux-gnu-ar
export CC_x86_64_unknown_linux_musl=musl-gcc

step() { printf '\n== %s\n' "$*"; }
fail() {
    echo "package.sh: FAIL: $*" >&2
    exit 1
}

version() { sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1; }
bin_of() { echo "$CARGO_TARGET_DIR/$1/release/hoox-edge"; }
arch_of() {
    case $1 in
    x86_64-*) echo amd64 ;;
    aarch64-*) echo arm64 ;;
    *) fail "no Debian architecture for $1" ;;
    esac
}

PKGS=(gcc-aarch64-linux-gnu qemu-user-static musl-tools systemd file dpkg-dev debootstrap curl)

apt_tools() {
    local missing=()
    for p in "${PKGS[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if ((${#missing[@]})); then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

install_tools() {
    step "tools"
    apt_tools
    rustup target add "${TARGETS[@]}" >/dev/null 2>&1 || rustup target add "${TARGETS[@]}"
    # --debug: builds in 49 s instead of 90 (2026-12-01), and packs the same .deb, byte
    # for byte, as fast: its work here is copying and compressing one small binary.
    # Pinned: an unpinned install takes the newest release, whose rust-version may one day
    # exceed the toolchain CI is fixed at; 3.8.0 needs Rust 1.85. A machine that has another
    # version gets the pinned one (--force: also over a cargo-deb cargo did not install).
    if [[ " $(cargo deb --version 2>/dev/null || true) " != *" $CARGO_DEB_VERSION "* ]]; then
        cargo install "cargo-deb@$CARGO_DEB_VERSION" --locked --debug --force
    fi
    # cargo-nextest runs the aarch64 tests (test_aarch64). The machine's image carries it;
    # any release that reads .config/nextest.toml's profile will do.
    if ! cargo nextest --version >/dev/null 2>&1; then
        cargo install cargo-nextest --locked
    fi
    echo "ok: ${PKGS[*]}, musl targets, $(cargo deb --version), $(cargo nextest --version | head -1)"
}

build() {
    step "release builds (LTO, one codegen unit)"
    local t0=$SECONDS args=()
    for t in "${TARGETS[@]}"; do args+=(--target "$t"); done
    # One cargo for both targets: its job queue fills one target's single-threaded LTO with
    # the other's compiling, and builds the host's build scripts once. 5 min 36 s for the
    # two here, against 3 min 30 s + 3 min 22 s one after the other (2026-12-01).
    cargo build --release --locked "${args[@]}" --bin hoox-edge
    echo "built ${TARGETS[*]} in $((SECONDS - t0))s"
}

check_static() {
    step "static binaries"
    for t in "${TARGETS[@]}"; do
        local bin desc want
        bin=$(bin_of "$t")
        desc=$(file -b "$bin")
        case $t in
        x86_64-*) want="x86-64" ;;
        aarch64-*) want="ARM aarch64" ;;
        esac
        [[ $desc == *"$want"* ]] || fail "$bin is not $want: $desc"
        [[ $desc == *"static"* && $desc != *"interpreter"* && $desc != *"dynamically"* ]] ||
            fail "$bin is not static: $desc"
        printf '%-28s %9s bytes  %s\n' "$t" "$(stat -c %s "$bin")" "${desc%%,*}, static"
    done
}

# The arm64 binary does what the amd64 one does: under qemu, a real serve on a temp state
# dir, whose printed curl line places an order (200) and then meets the mutex (409).
smoke_aarch64() {
    step "smoke test: aarch64 binary under qemu-aarch64-static"
    local bin out dir pid line answers ok=0 stopped=0
    bin=$(bin_of aarch64-unknown-linux-musl)
    out=$(qemu-aarch64-static "$bin" --version)
    [[ $out == *"$(version)"* ]] || fail "aarch64 --version printed '$out'"
    echo "ok: $out"
    dir=$(mktemp -d)
    qemu-aarch64-static "$bin" serve --state-dir "$dir/state" >"$dir/log" 2>&1 &
    pid=$!
    # Emulated TLS key generation is slow: give the first start up to 60 s to print its curl.
    for _ in $(seq 120); do
        line=$(grep -m1 -o 'curl .*' "$dir/log" || true)
        [[ -n $line ]] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if [[ -n $line ]] && answers=$(order_then_duplicate "$line" "$dir/answer"); then
        ok=1
    fi
    # A clean exit within 40 s of SIGTERM (stop_within, in .ci/order.sh), as readme.sh
    # asks of the x86_64 build; else SIGKILL and a failure, not a CI that hangs.
    stop_within "$pid" || stopped=$?
    if ((ok && stopped == 0)); then
        echo "ok: aarch64 serve: $answers; exit 0 on SIGTERM"
        rm -rf "$dir"
    else
        echo "--- serve log:" >&2
        cat "$dir/log" >&2
        echo "${answers:-no curl line within 60 s}" >&2
        ((stopped != 124)) || fail "aarch64 serve did not stop on SIGTERM within 40 s (log in $dir)"
        ((stopped == 0)) || fail "aarch64 serve exited $stopped on SIGTERM (log in $dir)"
        fail "aarch64 serve + curl (log in $dir)"
    fi
}

# The library's unit tests and the mutex's basic, concurrency, crash and fault tests, built for
# aarch64 and run under qemu: the database, the journal's direct I/O and the owner on the
# Pi's architecture, not only the binary's smoke test. The tests that run their test binary again as a child (a second
# process holding the lock, a crash) run it through the same emulator (HOOX_TEST_RUNNER,
# hoox_edge::testing), as the kernel here cannot exec an aarch64 binary by itself.
# nextest's qemu profile (.config/nextest.toml) runs each test as a process of its own, kills
# one that hangs, and says why: qemu-user can deadlock a fork beside other running threads.
test_aarch64() {
    step "aarch64: unit and mutex tests under qemu-aarch64-static"
    local t0=$SECONDS
    # Not mutex_ttl (20 s of waiting on expiries, by the host's clocks under qemu) nor
    # mutex_model (the model is the same logic on any architecture): CI's budget. The
    # timeout bounds what nextest's own per-test one cannot: the build, and nextest itself.
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_RUNNER=qemu-aarch64-static \
        HOOX_TEST_RUNNER=qemu-aarch64-static \
        timeout -k 30 1500 cargo nextest run --profile qemu --locked \
        --target aarch64-unknown-linux-musl --lib --test mutex_basic \
        --test mutex_concurrency --test mutex_crash --test mutex_faults
    echo "aarch64 tests passed in $((SECONDS - t0))s"
}

# `systemd-analyze verify` checks that every Exec*= command exists: run it against a copy of
# the unit whose /usr/bin/hoox-edge points at the binary just built.
# It exits 0 on what systemd itself only warns about and ignores: an unknown key or section
# ("...hoox-edge.service:76: Unknown key 'NoNewPrivilegs' in section [Service], ignoring."),
# a value it cannot parse ("...:41: Failed to parse sec value, ignoring: 10x"). Each such
# line names our unit: "<file>:<line>: ..." or "hoox-edge.service: ..." (systemd 252,
# 2026-12-03). So any line naming hoox-edge.service fails; other lines are about the units
# ours refers to (the host's, prefixed by their own file) and are only shown. On an offline
# machine without systemd running, the unit as shipped prints nothing at all.
check_unit() {
    step "systemd unit"
    local tmp score out
    tmp=$(mktemp -d)
    sed "s|/usr/bin/hoox-edge|$(bin_of x86_64-unknown-linux-musl)|g" "$UNIT" >"$tmp/hoox-edge.service"
    out=$(systemd-analyze verify "$tmp/hoox-edge.service" 2>&1) ||
        fail "systemd-analyze verify $UNIT:"$'\n'"$out"
    if grep -qF 'hoox-edge.service' <<<"$out"; then
        fail "systemd-analyze verify $UNIT warns (systemd ignores what it names):"$'\n'"$out"
    fi
    [[ -z $out ]] || printf 'note: systemd-analyze verify, about other units:\n%s\n' "$out"
    rm -rf "$tmp"
    echo "ok: systemd-analyze verify"
    # Across a reboot, expiries persist in wall time alone: the gateway must start after the
    # clock is set where the box can wait for it (README, docs/DESIGN.md). Within a boot the
    # boot clock holds them, which needs the boot id that ProcSubset=pid would hide.
    grep -qx 'After=time-sync.target' "$UNIT" || fail "$UNIT is not ordered after time-sync.target"
    ! grep -q '^ProcSubset=' "$UNIT" || fail "$UNIT sets ProcSubset=, which hides the boot id"
    score=$(systemd-analyze security --offline=true --no-pager "$UNIT" 2>&1 |
        sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
    [[ -n $score ]] || fail "no exposure score from systemd-analyze security"
    awk -v s="$score" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s <= m) }' ||
        fail "exposure $score above $MAX_EXPOSURE: run systemd-analyze security --offline=true $UNIT"
    echo "ok: exposure $score (limit $MAX_EXPOSURE)"
}

debs() {
    step ".deb packages"
    rm -rf "$OUT"
    mkdir -p "$OUT"
    for t in "${TARGETS[@]}"; do
        # Profile strip=true already stripped the binary; cargo-deb's strip would need the
        # target's binutils.
        cargo deb --target "$t" --no-build --no-strip --output "$OUT/" >/dev/null
    done
    ls -l "$OUT"
}

check_deb() {
    local deb=$1 arch=$2 want_file=$3 x
    [[ $(dpkg-deb -f "$deb" Package) == hoox-edge ]] || fail "$deb: Package"
    [[ $(dpkg-deb -f "$deb" Version) == "$(version)"* ]] || fail "$deb: Version"
    [[ $(dpkg-deb -f "$deb" Architecture) == "$arch" ]] || fail "$deb: Architecture"
    local contents
    contents=$(dpkg-deb -c "$deb")
    for f in ./usr/bin/hoox-edge ./usr/lib/systemd/system/hoox-edge.service \
        ./etc/hoox-edge/config.toml ./usr/share/doc/hoox-edge/README.md; do
        grep -q " $f\$" <<<"$contents" || fail "$deb lacks $f"
    done
    grep -Eq '^-rwxr-xr-x (root/root|0/0) .* ./usr/bin/hoox-edge$' <<<"$contents" ||
        fail "$deb: /usr/bin/hoox-edge is not root 0755"
    x=$(mktemp -d)
    dpkg-deb -e "$deb" "$x/DEBIAN"
    dpkg-deb -x "$deb" "$x/root"
    grep -qx /etc/hoox-edge/config.toml "$x/DEBIAN/conffiles" || fail "$deb: config not a conffile"
    for s in postinst prerm postrm; do
        [[ -x $x/DEBIAN/$s ]] || fail "$deb: no $s"
        ! grep -q '#DEBHELPER#' "$x/DEBIAN/$s" || fail "$deb: $s still has #DEBHELPER#"
    done
    grep -q 'deb-systemd-helper' "$x/DEBIAN/postinst" || fail "$deb: postinst does not enable the unit"
    file -b "$x/root/usr/bin/hoox-edge" | grep -q "$want_file" || fail "$deb: binary is not $want_file"
    cmp -s "$x/root/usr/lib/systemd/system/hoox-edge.service" "$UNIT" || fail "$deb: unit differs"
    rm -rf "$x"
    echo "ok: $(basename "$deb"): $arch, $(dpkg-deb -f "$deb" Version), binary, unit, conffile, scripts"
}

check_debs() {
    step "check .debs"
    local v
    v=$(version)
    check_deb "$(ls "$OUT"/hoox-edge_"$v"*_amd64.deb)" amd64 "x86-64"
    check_deb "$(ls "$OUT"/hoox-edge_"$v"*_arm64.deb)" arm64 "ARM aarch64"
}

# A real dpkg install needs a real Debian root: `dpkg --root` with --force-script-chrootless
# runs the maintainer scripts on the *host* (useradd and deb-systemd-helper would change this
# machine, not the scratch root). So: a debootstrapped bookworm (minbase, plus procps for
# /bin/kill used by ExecReload), cached across runs, and dpkg inside it with chroot. systemd
# does not run there, so deb-systemd-invoke only enables; starting is the systemd test's job.
in_root() { chroot "$CHROOT" "$@"; }

# The Debian root, made once and cached. Network-bound, so .ci/run starts it (`prefetch`)
# in the background while the CPU compiles.
make_root() {
    if [[ ! -x $CHROOT/usr/bin/dpkg ]]; then
        local t0=$SECONDS
        rm -rf "$CHROOT.tmp"
        mkdir -p "$(dirname "$CHROOT")"
        debootstrap --variant=minbase --include=procps bookworm "$CHROOT.tmp" \
            http://deb.debian.org/debian >/dev/null
        mv "$CHROOT.tmp" "$CHROOT"
        echo "debootstrap: $((SECONDS - t0))s"
    fi
}

install_test() {
    step "install test in a Debian 12 root ($CHROOT)"
    make_root
    local deb
    deb=$(ls "$OUT"/hoox-edge_"$(version)"*_amd64.deb)
    cp "$deb" "$CHROOT/tmp/hoox-edge.deb"
    # A previous run that failed midway may have left it installed, and the stubs of the
    # tests that stand in for systemd (the root has none: no /run/systemd, no systemctl).
    rm -f "$CHROOT/usr/local/sbin/systemctl" "$CHROOT/usr/local/sbin/systemctl.show" "$CHROOT/usr/local/sbin/od"
    rm -rf "$CHROOT/run/systemd"
    if mountpoint -q "$CHROOT/var/lib/hoox-edge"; then umount "$CHROOT/var/lib/hoox-edge"; fi
    in_root dpkg --purge hoox-edge >/dev/null 2>&1 || true
    in_root userdel -r hoox-edge >/dev/null 2>&1 || true

    # A person's login named hoox-edge is not taken over as the service's account.
    in_root useradd -m -u 1500 -s /bin/sh hoox-edge
    local out rc=0
    out=$(in_root dpkg -i /tmp/hoox-edge.deb 2>&1) || rc=$?
    ((rc != 0)) || fail "dpkg -i took over a login account hoox-edge:"$'\n'"$out"
    grep -qF "is not a system account (uid 1500)" <<<"$out" ||
        fail "the refused install did not say why:"$'\n'"$out"
    [[ ! -e $CHROOT/etc/hoox-edge/secrets/hmac ]] || fail "secrets made for a login account"
    in_root userdel -r hoox-edge >/dev/null 2>&1
    in_root dpkg --configure -a >/dev/null || fail "dpkg --configure -a failed once the login was gone"
    in_root dpkg --purge hoox-edge >/dev/null
    echo "ok: a login account named hoox-edge fails the install; gone, the install ends"

    # Nor a group of that name made before the package: a login's group (gid 1600), or a
    # system group with a member, listed or by its primary group, who would read the TLS
    # key and the config.
    in_root useradd -M -u 1601 -s /bin/sh alice
    for make_group in "groupadd -g 1600 hoox-edge" "groupadd --system -U alice hoox-edge" \
        "groupadd --system hoox-edge && useradd -M -u 1602 -g hoox-edge -s /bin/sh bob"; do
        in_root sh -c "$make_group"
        rc=0
        out=$(in_root dpkg -i /tmp/hoox-edge.deb 2>&1) || rc=$?
        ((rc != 0)) || fail "dpkg -i took over a group hoox-edge ($make_group):"$'\n'"$out"
        grep -qF "a group hoox-edge exists" <<<"$out" ||
            fail "the refused install did not say why ($make_group):"$'\n'"$out"
        ! in_root getent passwd hoox-edge >/dev/null || fail "a user made beside that group"
        in_root userdel bob 2>/dev/null || true
        in_root groupdel hoox-edge
        in_root dpkg --configure -a >/dev/null || fail "dpkg --configure -a failed once the group was gone"
        in_root dpkg --purge hoox-edge >/dev/null
    done
    in_root userdel alice
    echo "ok: a group hoox-edge not the package's fails the install; gone, the install ends"

    out=$(in_root dpkg -i /tmp/hoox-edge.deb 2>&1) || fail "dpkg -i failed:"$'\n'"$out"
    printf '%s\n' "$out"
    # A first install is clean: the check it prints says ok, and warns of nothing (the
    # state folder, which check-config looks for, is there).
    grep -qF "config.toml: ok (executor: paper" <<<"$out" || fail "the install printed no ok"
    ! grep -qi "warning" <<<"$out" || fail "a first install warns:"$'\n'"$out"
    in_root getent passwd hoox-edge | grep -q ':/var/lib/hoox-edge:/usr/sbin/nologin$' ||
        fail "no system user hoox-edge"
    expect_mode /var/lib/hoox-edge "700 hoox-edge:hoox-edge"
    expect_mode /etc/hoox-edge "750 root:hoox-edge"
    expect_mode /etc/hoox-edge/tls "750 root:hoox-edge"
    expect_mode /etc/hoox-edge/secrets "700 hoox-edge:hoox-edge"
    expect_mode /etc/hoox-edge/secrets/hmac "600 hoox-edge:hoox-edge"
    expect_mode /etc/hoox-edge/secrets/api-keys "600 hoox-edge:hoox-edge"
    expect_mode /etc/hoox-edge/config.toml "644 root:root"
    grep -qE '^[0-9a-f]{64}$' "$CHROOT/etc/hoox-edge/secrets/hmac" || fail "hmac secret is not 32 random bytes in hex"
    expect_mode /etc/hoox-edge/tls/key.pem "640 root:hoox-edge"
    expect_mode /etc/hoox-edge/tls/cert.pem "644 root:hoox-edge"
    # shellcheck disable=SC2016 # dpkg-query's own ${field} syntax
    in_root dpkg-query -W -f='${Conffiles}\n' hoox-edge | grep -q /etc/hoox-edge/config.toml ||
        fail "config.toml not registered as a conffile"
    [[ -L $CHROOT/etc/systemd/system/multi-user.target.wants/hoox-edge.service ]] ||
        fail "unit not enabled"
    # check_unit verified this unit against the built binary and check_deb that the package
    # carries it unchanged (the minbase root has no systemd units to verify against).
    cmp -s "$CHROOT/usr/lib/systemd/system/hoox-edge.service" "$UNIT" || fail "installed unit differs"
    [[ -x $CHROOT/bin/kill ]] || fail "no /bin/kill for ExecReload (procps dependency)"
    in_root /usr/bin/hoox-edge check-config --config /etc/hoox-edge/config.toml ||
        fail "the installed default config does not pass check-config"
    reload_check
    echo "ok: user, directories and modes, secrets, conffile, unit installed and enabled"

    local secret
    secret=$(cat "$CHROOT/etc/hoox-edge/secrets/hmac")
    in_root dpkg -i /tmp/hoox-edge.deb >/dev/null
    [[ $(cat "$CHROOT/etc/hoox-edge/secrets/hmac") == "$secret" ]] || fail "reinstall replaced the secret"
    echo "ok: reinstall keeps the secret"

    upgrade_check_test
    paper_upgrade_test
    service_start_test

    mkdir -p "$CHROOT/var/lib/hoox-edge" && touch "$CHROOT/var/lib/hoox-edge/mutex.redb"
    in_root dpkg --remove hoox-edge >/dev/null
    [[ -f $CHROOT/etc/hoox-edge/config.toml && -f $CHROOT/etc/hoox-edge/secrets/hmac &&
        -f $CHROOT/var/lib/hoox-edge/mutex.redb ]] || fail "remove deleted config, secrets or state"
    in_root getent passwd hoox-edge >/dev/null || fail "remove deleted the user"
    echo "ok: remove keeps config, secrets, state and user"

    out=$(in_root dpkg --purge hoox-edge 2>&1) || fail "purge failed:"$'\n'"$out"
    [[ ! -e $CHROOT/etc/hoox-edge && ! -e $CHROOT/var/lib/hoox-edge ]] ||
        fail "purge left /etc/hoox-edge or /var/lib/hoox-edge"
    # It says what it deletes: apt prints nothing else of the live keys going.
    for said in "deleting what /var/lib/hoox-edge holds: the mutex database and its journal, with every live key" \
        "deleting /etc/hoox-edge/secrets" "deleting /etc/hoox-edge/tls"; do
        grep -qF "hoox-edge: purge: $said" <<<"$out" || fail "purge did not say '$said':"$'\n'"$out"
    done
    ! in_root getent passwd hoox-edge >/dev/null || fail "purge left the user"
    [[ ! -e $CHROOT/etc/systemd/system/multi-user.target.wants/hoox-edge.service ]] ||
        fail "purge left the unit enabled"
    echo "ok: purge removes config, secrets, certificates, state, user and enablement, and says so"

    # The state folder a mount point of its own (a disk for the store, as the README
    # allows): purged of its contents, left in place, and the purge ends (it stopped at the
    # folder, the user left behind, every retry failing the same way).
    in_root dpkg -i /tmp/hoox-edge.deb >/dev/null
    mount -t tmpfs -o size=1m,mode=0700 tmpfs "$CHROOT/var/lib/hoox-edge"
    touch "$CHROOT/var/lib/hoox-edge/mutex.redb" "$CHROOT/var/lib/hoox-edge/mutex.redb-journal"
    local rc=0 out
    out=$(in_root dpkg --purge hoox-edge 2>&1) || rc=$?
    [[ -z $(ls -A "$CHROOT/var/lib/hoox-edge") ]] || rc=99
    umount "$CHROOT/var/lib/hoox-edge"
    rmdir "$CHROOT/var/lib/hoox-edge"
    ((rc == 0)) || fail "purge with /var/lib/hoox-edge a mount point: exit $rc, or the store left:"$'\n'"$out"
    ! in_root getent passwd hoox-edge >/dev/null || fail "purge with the store a mount point left the user"
    echo "ok: purge empties a store folder that is a mount point, and ends"

    # A file of the operator's in /etc/hoox-edge stays, on root's group: the package's GID
    # goes with the group, to whichever system group comes next.
    in_root dpkg -i /tmp/hoox-edge.deb >/dev/null
    in_root sh -c 'echo ca >/etc/hoox-edge/clients.pem && chown root:hoox-edge /etc/hoox-edge/clients.pem && chmod 0640 /etc/hoox-edge/clients.pem'
    in_root dpkg --purge hoox-edge >/dev/null
    expect_mode /etc/hoox-edge "750 root:root"
    expect_mode /etc/hoox-edge/clients.pem "640 root:root"
    rm -rf "$CHROOT/etc/hoox-edge"
    echo "ok: purge leaves the operator's own files, on root's group"

    # A host name gen-cert refuses (all digits) costs that name, not the certificate.
    unshare --uts sh -c "hostname 1234 && chroot '$CHROOT' dpkg -i /tmp/hoox-edge.deb" >/dev/null ||
        fail "the install failed on a host named 1234"
    expect_mode /etc/hoox-edge/tls/cert.pem "644 root:hoox-edge"
    in_root dpkg --purge hoox-edge >/dev/null
    echo "ok: on a host whose name no certificate can carry, the loopback names are certified"

    # An install stopped while it made a secret (a stub od fails there, as a power cut
    # would stop it) is finished by `dpkg --configure -a`, which makes the secret. It left
    # an empty or root-owned secret file, which the next run kept (it never replaces a
    # secret) and the service could not read: the install failed until it was deleted.
    local od_stub=$CHROOT/usr/local/sbin/od
    printf '%s\n' '#!/bin/sh' 'case "$*" in "-An -tx1") exit 1 ;; esac' 'exec /usr/bin/od "$@"' >"$od_stub"
    chmod 0755 "$od_stub"
    rc=0
    out=$(in_root dpkg -i /tmp/hoox-edge.deb 2>&1) || rc=$?
    rm -f "$od_stub"
    ((rc != 0)) || fail "the install went on though it made no secret:"$'\n'"$out"
    out=$(in_root dpkg --configure -a 2>&1) ||
        fail "dpkg --configure -a did not finish an install stopped while it made a secret:"$'\n'"$out"
    expect_mode /etc/hoox-edge/secrets/hmac "600 hoox-edge:hoox-edge"
    grep -qE '^[0-9a-f]{64}$' "$CHROOT/etc/hoox-edge/secrets/hmac" || fail "the secret made on the second run is not 32 random bytes in hex"
    in_root dpkg --purge hoox-edge >/dev/null 2>&1
    echo "ok: an install stopped while it made a secret is finished by dpkg --configure -a"
    rm -f "$CHROOT/tmp/hoox-edge.deb"
}

# The postinst checks the config with the binary it installs before the service is
# restarted: a config that binary refuses fails the install (half-configured, the reason on
# stderr) rather than leave a service that exits 78 behind an apt that says all went well.
# Here the refused config is an unknown section in the conffile (a reinstall of the same
# version keeps the edited conffile, as an upgrade does). Fixed, `dpkg --configure -a`
# finishes; HOOX_EDGE_SKIP_CONFIG_CHECK=1 goes on despite the refusal, saying so.
upgrade_check_test() {
    local conf=$CHROOT/etc/hoox-edge/config.toml saved out rc=0
    saved=$(mktemp)
    cp -p "$conf" "$saved"
    printf '\n[not_a_section]\n' >>"$conf"
    out=$(in_root dpkg -i /tmp/hoox-edge.deb 2>&1) || rc=$?
    ((rc != 0)) || fail "dpkg -i succeeded with a config that check-config refuses:"$'\n'"$out"
    for said in "REFUSES its configuration" "not_a_section" "WILL NOT START" "dpkg --configure -a"; do
        grep -qF "$said" <<<"$out" || fail "the refused install did not say '$said':"$'\n'"$out"
    done
    [[ $(pkg_status) == "install ok half-configured" ]] ||
        fail "after a refused config the package is '$(pkg_status)', want half-configured"
    cp -p "$saved" "$conf"
    in_root dpkg --configure -a >/dev/null || fail "dpkg --configure -a failed once the config was fixed"
    [[ $(pkg_status) == "install ok installed" ]] || fail "after the fix the package is '$(pkg_status)'"
    echo "ok: a config the new binary refuses fails the install (half-configured, said); fixed, dpkg --configure -a ends it"

    # A key only root may read: the check runs as the service's user, which `serve` is.
    local key=$CHROOT/etc/hoox-edge/tls/key.pem
    chown root:root "$key" && chmod 0600 "$key"
    rc=0
    out=$(in_root dpkg -i /tmp/hoox-edge.deb 2>&1) || rc=$?
    chown "root:$(stat -c %g "$CHROOT/etc/hoox-edge/tls")" "$key" && chmod 0640 "$key"
    ((rc != 0)) || fail "dpkg -i succeeded with a key.pem the service cannot read:"$'\n'"$out"
    grep -qF "server.key" <<<"$out" || fail "the refused install did not name server.key:"$'\n'"$out"
    in_root dpkg --configure -a >/dev/null || fail "dpkg --configure -a failed once the key was readable again"
    echo "ok: the check runs as the service's user: a key.pem only root reads fails the install"

    # A deleted conffile, which dpkg does not bring back: refused too, with how to restore it.
    rm "$conf"
    rc=0
    out=$(in_root dpkg -i /tmp/hoox-edge.deb 2>&1) || rc=$?
    cp -p "$saved" "$conf"
    ((rc != 0)) || fail "dpkg -i succeeded with config.toml deleted:"$'\n'"$out"
    grep -qF "config.toml is missing" <<<"$out" &&
        grep -qF "dpkg -i --force-confmiss ./hoox-edge_<version>_<arch>.deb" <<<"$out" ||
        fail "the refused install did not say config.toml is missing and how to restore it:"$'\n'"$out"
    # The command it gives, for a package installed from its file, brings the packaged one
    # back and ends the install, naming the paper executor it has.
    rm "$conf"
    out=$(in_root dpkg -i --force-confmiss /tmp/hoox-edge.deb 2>&1) ||
        fail "dpkg -i --force-confmiss did not restore config.toml:"$'\n'"$out"
    [[ -e $conf ]] || fail "dpkg -i --force-confmiss left no config.toml"
    grep -qF "ok (executor: paper" <<<"$out" ||
        fail "the install did not say its config's executor:"$'\n'"$out"
    cp -p "$saved" "$conf"
    echo "ok: a deleted config.toml fails the install, saying how to restore it, which works"

    unit_workers_test

    printf '\n[not_a_section]\n' >>"$conf"
    rc=0
    out=$(in_root env HOOX_EDGE_SKIP_CONFIG_CHECK=1 dpkg -i /tmp/hoox-edge.deb 2>&1) || rc=$?
    cp -p "$saved" "$conf"
    rm -f "$saved"
    ((rc == 0)) || fail "HOOX_EDGE_SKIP_CONFIG_CHECK=1 did not let the install go on:"$'\n'"$out"
    grep -qF "REFUSES its configuration" <<<"$out" || fail "HOOX_EDGE_SKIP_CONFIG_CHECK=1 hid the refusal:"$'\n'"$out"
    echo "ok: HOOX_EDGE_SKIP_CONFIG_CHECK=1 installs despite the refusal, and still says it"
}

# An upgrade whose packaged config.toml changed asks about it; answered with the package's
# (--force-confnew), the operator's http executor is replaced by the package's paper one,
# saved as config.toml.dpkg-old, and the restart would have put a live gateway on paper
# (200 "simulated", no order placed). The postinst refuses that as it refuses a config
# (half-configured, said), until the operator's config is moved back or
# HOOX_EDGE_ALLOW_PAPER=1. --force-confold keeps the operator's, without a question (the
# README's non-interactive upgrade); with no answer at all, an upgrade without a terminal
# fails at the question. The upgrades are this .deb repacked: a higher version, and a line
# more in its config.toml.
paper_upgrade_test() {
    local conf=$CHROOT/etc/hoox-edge/config.toml x n out rc=0 said
    x=$(mktemp -d)
    for n in 1 2 3; do
        dpkg-deb -R "$CHROOT/tmp/hoox-edge.deb" "$x/up$n"
        sed -i "s/^Version: .*/&+up$n/" "$x/up$n/DEBIAN/control"
        echo "# upgrade $n" >>"$x/up$n/etc/hoox-edge/config.toml"
        if [[ -e $x/up$n/DEBIAN/md5sums ]]; then
            sed -i "s|^[0-9a-f]*  etc/hoox-edge/config.toml\$|$(cd "$x/up$n" && md5sum etc/hoox-edge/config.toml)|" \
                "$x/up$n/DEBIAN/md5sums"
        fi
        dpkg-deb -b --root-owner-group "$x/up$n" "$CHROOT/tmp/hoox-edge-up$n.deb" >/dev/null
    done
    rm -rf "$x"
    rm -f "$conf.dpkg-old" "$conf.dpkg-dist"
    # The operator's: real orders, to an address nothing listens on (check-config passes).
    sed -i 's|^kind = "paper"$|kind = "http"\nurl = "http://127.0.0.1:9/orders"|' "$conf"
    in_root /usr/bin/hoox-edge check-config --config /etc/hoox-edge/config.toml 2>&1 |
        grep -qF "ok (executor: http" || fail "the http config does not pass check-config"
    local http
    http=$(cat "$conf")

    out=$(in_root dpkg -i --force-confnew /tmp/hoox-edge-up1.deb 2>&1 </dev/null) || rc=$?
    ((rc != 0)) || fail "an upgrade that put the package's paper config in place of an http one succeeded:"$'\n'"$out"
    for said in "config.toml REPLACED YOURS" "PAPER executor" \
        "Yours (executor http: orders go to http://127.0.0.1:9" "is now /etc/hoox-edge/config.toml.dpkg-old" \
        "has NOT been restarted" \
        "mv /etc/hoox-edge/config.toml.dpkg-old /etc/hoox-edge/config.toml && dpkg --configure -a" \
        "HOOX_EDGE_ALLOW_PAPER=1 dpkg --configure -a"; do
        grep -qF "$said" <<<"$out" || fail "the refused upgrade did not say '$said':"$'\n'"$out"
    done
    [[ $(pkg_status) == "install ok half-configured" ]] ||
        fail "after the paper config replaced an http one the package is '$(pkg_status)', want half-configured"
    [[ $(cat "$conf.dpkg-old" 2>/dev/null) == "$http" ]] || fail "the http config is not config.toml.dpkg-old"
    grep -qx 'kind = "paper"' "$conf" || fail "the package's config.toml is not the paper one"
    printf '%s\n' "$out" | grep -F 'hoox-edge: ' | sed 's/^/    | /'
    # Still so when asked again, as long as that config.toml.dpkg-old is there.
    rc=0
    out=$(in_root dpkg --configure -a 2>&1) || rc=$?
    ((rc != 0)) && grep -qF "config.toml REPLACED YOURS" <<<"$out" ||
        fail "dpkg --configure -a, the http config still config.toml.dpkg-old, went on:"$'\n'"$out"
    # What it says to do: moved back, the upgrade ends, on the operator's config.
    in_root mv /etc/hoox-edge/config.toml.dpkg-old /etc/hoox-edge/config.toml
    out=$(in_root dpkg --configure -a 2>&1) || fail "dpkg --configure -a failed once the http config was moved back:"$'\n'"$out"
    grep -qF "config.toml: ok (executor: http" <<<"$out" || fail "the finished upgrade did not say its http executor:"$'\n'"$out"
    [[ $(pkg_status) == "install ok installed" ]] || fail "after the move back the package is '$(pkg_status)'"
    echo "ok: the package's paper config in place of an http one (--force-confnew) fails the upgrade (half-configured, said); moved back, dpkg --configure -a ends it"

    # The same where systemd runs (a stub: /run/systemd/system, and a systemctl whose `show`
    # prints the unit's Environment= as systemd 252 does for the packaged unit: an empty
    # line). The postinst's reading of that environment once reset its arguments, so the
    # version upgraded from was lost and the check above skipped: on every host where
    # systemd runs, the upgrade went on and restarted the gateway onto paper.
    local log=$CHROOT/tmp/systemctl.log
    stub_systemctl '*"show --property=Environment --value hoox-edge.service"*) echo ;;' \
        '*is-enabled*) echo enabled ;;'
    rm -f "$log"
    rc=0
    out=$(in_root dpkg -i --force-confnew /tmp/hoox-edge-up3.deb 2>&1 </dev/null) || rc=$?
    ((rc != 0)) && grep -qF "config.toml REPLACED YOURS" <<<"$out" ||
        fail "under systemd, an upgrade that put the package's paper config in place of an http one went on:"$'\n'"$out"
    ! grep -q 'restart' "$log" 2>/dev/null ||
        fail "under systemd, the refused paper upgrade restarted the service:"$'\n'"$(cat "$log")"
    [[ $(pkg_status) == "install ok half-configured" ]] ||
        fail "under systemd, after the paper config replaced an http one the package is '$(pkg_status)'"
    in_root mv /etc/hoox-edge/config.toml.dpkg-old /etc/hoox-edge/config.toml
    out=$(in_root dpkg --configure -a 2>&1) || fail "under systemd, dpkg --configure -a failed once the http config was moved back:"$'\n'"$out"
    grep -q 'try-restart hoox-edge[.]service' "$log" ||
        fail "under systemd, the finished upgrade did not try-restart:"$'\n'"$(cat "$log")"
    unstub_systemctl
    echo "ok: so too where systemd runs (the unit's environment read): refused, not restarted; moved back, it ends and restarts"

    # Without a terminal nor an answer, the question fails the upgrade; --force-confold
    # answers it: the operator's config stays, the package's beside it as .dpkg-dist.
    rc=0
    out=$(in_root dpkg -i /tmp/hoox-edge-up2.deb 2>&1 </dev/null) || rc=$?
    ((rc != 0)) && grep -qF "conffile prompt" <<<"$out" ||
        fail "an upgrade without a terminal did not fail at the conffile question:"$'\n'"$out"
    out=$(in_root dpkg -i --force-confold /tmp/hoox-edge-up2.deb 2>&1 </dev/null) ||
        fail "dpkg -i --force-confold failed:"$'\n'"$out"
    [[ $(cat "$conf") == "$http" ]] || fail "--force-confold did not keep the http config"
    [[ -e $conf.dpkg-dist && ! -e $conf.dpkg-old ]] || fail "--force-confold: no config.toml.dpkg-dist, or a .dpkg-old"
    grep -qF "config.toml: ok (executor: http" <<<"$out" || fail "--force-confold: no ok for the http executor:"$'\n'"$out"
    [[ $(pkg_status) == "install ok installed" ]] || fail "after --force-confold the package is '$(pkg_status)'"
    echo "ok: without a terminal the conffile question fails an upgrade; --force-confold keeps the http config and ends it"

    # On paper on purpose (here a downgrade to the package tested, which is asked about
    # the same way).
    rc=0
    out=$(in_root env HOOX_EDGE_ALLOW_PAPER=1 dpkg -i --force-confnew /tmp/hoox-edge.deb 2>&1 </dev/null) || rc=$?
    ((rc == 0)) || fail "HOOX_EDGE_ALLOW_PAPER=1 did not let the paper config in:"$'\n'"$out"
    grep -qF "config.toml REPLACED YOURS" <<<"$out" && grep -qF "HOOX_EDGE_ALLOW_PAPER=1: going on" <<<"$out" ||
        fail "HOOX_EDGE_ALLOW_PAPER=1 did not say what it let through:"$'\n'"$out"
    grep -qx 'kind = "paper"' "$conf" || fail "HOOX_EDGE_ALLOW_PAPER=1: the config is not the paper one"
    [[ $(pkg_status) == "install ok installed" ]] || fail "after HOOX_EDGE_ALLOW_PAPER=1 the package is '$(pkg_status)'"
    # That config.toml.dpkg-old, left there, is an earlier upgrade's for the next one.
    sleep 1
    out=$(in_root dpkg -i /tmp/hoox-edge.deb 2>&1 </dev/null) ||
        fail "a reinstall failed on the config.toml.dpkg-old of an earlier upgrade:"$'\n'"$out"
    rm -f "$conf.dpkg-old" "$conf.dpkg-dist" "$CHROOT"/tmp/hoox-edge-up[123].deb
    echo "ok: HOOX_EDGE_ALLOW_PAPER=1 takes the paper config, saying so; a config.toml.dpkg-old of an earlier upgrade is not taken for this one's"
}

# The check runs with the unit's TOKIO_WORKER_THREADS, as `systemctl show` gives it under a
# running systemd: the root has none, so a stub `systemctl` answers for it (and does nothing
# for the snippets' daemon-reload and restart). Set but empty, which `serve` refuses (exit
# 78), fails the install, as a bad number does, and so does one systemd quotes; a good one
# passes, beside another variable whose quoted value holds its name. Before 0.2.17 an empty
# one, and a quoted one, were dropped, and the install passed a config the service would
# not start with.
unit_workers_test() {
    local show=$CHROOT/usr/local/sbin/systemctl.show workers out rc
    # What systemd 252 prints: a value with a space or a shell character quoted for a shell
    # (`Environment=TOKIO_WORKER_THREADS=$(nproc)`, a drop-in's mistake: no `$` is expanded).
    # Each the value the unit gives, then what `systemctl show` prints for it.
    local cases=(
        "" 'LANG=C.UTF-8 TOKIO_WORKER_THREADS='
        0 'LANG=C.UTF-8 TOKIO_WORKER_THREADS=0'
        '$(nproc)' 'LANG=C.UTF-8 "TOKIO_WORKER_THREADS=\$(nproc)"'
        '2 4' '"TOKIO_WORKER_THREADS=2 4" "JAVA_OPTS=-Xmx1g -Xms1g"'
        2 '"X=a TOKIO_WORKER_THREADS=0" TOKIO_WORKER_THREADS=2'
    ) i
    for ((i = 0; i < ${#cases[@]}; i += 2)); do
        workers=${cases[i]}
        printf '#!/bin/sh\ncat <<"EOF"\n%s\nEOF\n' "${cases[i + 1]}" >"$show"
        stub_systemctl "*\"show --property=Environment --value hoox-edge.service\"*) exec /bin/sh ${show#"$CHROOT"} ;;"
        rc=0
        out=$(in_root dpkg -i /tmp/hoox-edge.deb 2>&1) || rc=$?
        if [[ $workers == 2 ]]; then
            ((rc == 0)) || fail "TOKIO_WORKER_THREADS=2 in the unit failed the install:"$'\n'"$out"
        else
            ((rc != 0)) && grep -qF "TOKIO_WORKER_THREADS=\"$workers\"" <<<"$out" &&
                grep -qF "systemctl edit hoox-edge" <<<"$out" ||
                fail "TOKIO_WORKER_THREADS='$workers' in the unit did not fail the install, naming it:"$'\n'"$out"
        fi
    done
    unstub_systemctl
    [[ $(pkg_status) == "install ok installed" ]] || fail "after the unit's workers tests the package is '$(pkg_status)'"
    echo "ok: the check takes the unit's TOKIO_WORKER_THREADS, empty or quoted too (refused, named)"
}

# Who starts the service: a first install starts it; an upgrade restarts it only if it runs,
# and says so when it does not. Before 0.2.21 the generated snippet's `deb-systemd-invoke
# restart` started an enabled unit the operator had stopped (to move or restore its store):
# a gateway with no database there makes an empty one, and retries go through. A stub
# `systemctl` in the root logs what it is asked (deb-systemd-invoke is the real one) and
# says the unit is enabled, and active or not as the case wants.
service_start_test() {
    local log=$CHROOT/tmp/systemctl.log active out
    [[ -n $CHROOT && -d $CHROOT/usr ]] || fail "no Debian root at '$CHROOT'"
    # A unit stopped stays stopped here, as under systemd: `stop` takes the mark away.
    stub_systemctl '*is-enabled*) echo enabled ;;' \
        '*is-active*) [ -e /tmp/hoox-edge.active ] || exit 3 ;;' \
        '"stop "* | *" stop "*) rm -f /tmp/hoox-edge.active ;;'
    # start or restart by name, not try-restart: what starts a stopped unit.
    local starts='(^|[[:space:]])(re)?start hoox-edge[.]service'
    for active in 0 1; do
        rm -f "$log" "$CHROOT/tmp/hoox-edge.active"
        ((active == 0)) || touch "$CHROOT/tmp/hoox-edge.active"
        out=$(in_root dpkg -i /tmp/hoox-edge.deb 2>&1) || fail "the upgrade failed:"$'\n'"$out"
        grep -q 'try-restart hoox-edge[.]service' "$log" ||
            fail "an upgrade (active $active) did not try-restart:"$'\n'"$(cat "$log")"
        ! grep -Eq "$starts" "$log" ||
            fail "an upgrade (active $active) started or restarted outright:"$'\n'"$(cat "$log")"
        # Not stopped across it either: the try-restart would then leave it down.
        ! grep -q 'stop hoox-edge[.]service' "$log" ||
            fail "an upgrade (active $active) stopped the service:"$'\n'"$(cat "$log")"
        if ((active == 0)); then
            grep -qF "the service is not running, and was not started" <<<"$out" ||
                fail "an upgrade of a stopped gateway did not say it stays stopped:"$'\n'"$out"
        else
            ! grep -qF "not running" <<<"$out" || fail "an upgrade of a running gateway said it is not:"$'\n'"$out"
        fi
    done
    # A first install starts it.
    in_root dpkg --purge hoox-edge >/dev/null
    rm -f "$log" "$CHROOT/tmp/hoox-edge.active"
    out=$(in_root dpkg -i /tmp/hoox-edge.deb 2>&1) || fail "the first install failed:"$'\n'"$out"
    grep -Eq '(^|[[:space:]])start hoox-edge[.]service' "$log" ||
        fail "a first install did not start the service:"$'\n'"$(cat "$log")"
    rm -f "$CHROOT/tmp/hoox-edge.active"
    unstub_systemctl
    echo "ok: an upgrade restarts the service only if it runs (and says so when not); a first install starts it"
}

# The tests that stand in for systemd (the root has none): /run/systemd/system, which the
# maintainer scripts take for a running systemd, and a `systemctl` in the root's PATH that
# logs what it is asked to /tmp/systemctl.log and answers by the `case` arms given (sh
# lines), exit 0 otherwise. Called again, it replaces the arms; `unstub_systemctl` undoes
# it all, /run/systemd only if this made it.
STUB_MADE_RUN=0
stub_systemctl() {
    if [[ ! -d $CHROOT/run/systemd/system ]]; then
        STUB_MADE_RUN=1
        mkdir -p "$CHROOT/run/systemd/system"
    fi
    mkdir -p "$CHROOT/usr/local/sbin"
    # shellcheck disable=SC2016 # the stub's own $*
    printf '%s\n' '#!/bin/sh' 'echo "$*" >>/tmp/systemctl.log' 'case "$*" in' "$@" 'esac' 'exit 0' \
        >"$CHROOT/usr/local/sbin/systemctl"
    chmod 0755 "$CHROOT/usr/local/sbin/systemctl"
}

unstub_systemctl() {
    rm -f "$CHROOT/usr/local/sbin/systemctl" "$CHROOT/usr/local/sbin/systemctl.show" "$CHROOT/tmp/systemctl.log"
    if ((STUB_MADE_RUN)); then
        rm -rf "$CHROOT/run/systemd"
        STUB_MADE_RUN=0
    fi
}

# shellcheck disable=SC2016 # dpkg-query's own ${field} syntax
pkg_status() { in_root dpkg-query -W -f='${Status}' hoox-edge; }

# `systemctl reload` runs the unit's first ExecReload= (the check) as the service's user
# before it signals: run that line as hoox-edge in the root, on the installed files, then
# with each file the reload re-reads broken in turn. It must pass, then fail with EX_CONFIG.
reload_check() {
    local check rc f saved lines
    mapfile -t lines < <(sed -n 's/^ExecReload=//p' "$UNIT")
    check=${lines[0]:-}
    [[ $check == /usr/bin/hoox-edge\ check-config* ]] || fail "the first ExecReload= is not the check: $check"
    # shellcheck disable=SC2016 # systemd's $MAINPID, literally
    [[ ${#lines[@]} == 2 && ${lines[1]} == '/bin/kill -HUP $MAINPID' ]] ||
        fail "the check is not followed by the signal alone: ${lines[*]:1}"
    # shellcheck disable=SC2086 # the unit's command line, split as systemd splits it
    chroot --userspec=hoox-edge:hoox-edge "$CHROOT" $check >/dev/null ||
        fail "the reload check fails as hoox-edge on the installed files"
    for f in /etc/hoox-edge/tls/cert.pem /etc/hoox-edge/secrets/hmac; do
        saved=$(mktemp)
        cp -p "$CHROOT$f" "$saved"
        : >"$CHROOT$f"
        rc=0
        # shellcheck disable=SC2086
        chroot --userspec=hoox-edge:hoox-edge "$CHROOT" $check >/dev/null 2>&1 || rc=$?
        cp -p "$saved" "$CHROOT$f"
        rm -f "$saved"
        [[ $rc == 78 ]] || fail "the reload check exits $rc with an empty $f, want 78"
    done
    echo "ok: the reload check passes as hoox-edge, and fails (78) on an empty certificate or secret"
}

expect_mode() {
    [[ -e $CHROOT$1 ]] || fail "$1 missing"
    # Owners resolve through the root's passwd and group, not the host's.
    local uid gid user group got
    uid=$(stat -c %u "$CHROOT$1")
    gid=$(stat -c %g "$CHROOT$1")
    user=$(in_root getent passwd "$uid" | cut -d: -f1)
    group=$(in_root getent group "$gid" | cut -d: -f1)
    got="$(stat -c %a "$CHROOT$1") $user:$group"
    [[ $got == "$2" ]] || fail "$1 is '$got', want '$2'"
}

main() {
    local t0=$SECONDS
    [[ $(id -u) == 0 ]] || fail "run as root (apt-get, chroot)"
    if [[ ${1:-} == prefetch ]]; then
        apt_tools
        [[ -n ${SKIP_INSTALL_TEST:-} ]] || make_root
        echo "prefetch done in $((SECONDS - t0))s"
        return
    fi
    install_tools
    build
    check_static
    smoke_aarch64
    test_aarch64
    check_unit
    debs
    check_debs
    if [[ -z ${SKIP_INSTALL_TEST:-} ]]; then
        install_test
    else
        echo "skip: install test (SKIP_INSTALL_TEST)"
    fi
    step "all package checks passed in $((SECONDS - t0))s; .debs in $OUT"
}

main "$@"
