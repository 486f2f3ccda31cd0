//! The load tool end to end, as `scripts/bench.sh` uses it: `hoox-load run` drives the real
//! gateway over TLS, the gateway forwards to `hoox-load ledger`, and the ledger's verdict is
//! what a user sizing a box trusts. So it must hold both ways: a run with repeated trades, and
//! a replay after a restart, are passed; a gateway that lost its state and forwards the same
//! trades again is caught, by `run --ledger` and by `check-ledger`. Also: the bare TLS
//! baseline every ratio divides by, and what the tool reports when requests fail.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper::Method;
use serde_json::Value;
use support::client::TlsClient;
use support::gateway::{Gateway, SECRET, Setup, write_secret};

const LOAD: &str = env!("CARGO_BIN_EXE_hoox-load");

const BARE: &str = env!("CARGO_BIN_EXE_bare-tls");

/// A server of the bench (the ledger, the bare TLS baseline) on a port of its own, learnt from
/// the line it prints first; killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(bin: &str, args: &[&str], announce: &str) -> Server {
        use std::io::{BufRead, BufReader};
        let mut child = Command::new(bin)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a bench server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .strip_prefix(announce)
            .and_then(|rest| rest.split(['/', ' ', '\n']).next())
            .and_then(|addr| addr.parse().ok());
        match addr {
            Some(addr) => Server { child, addr },
            None => {
                // Not left running after the test.
                let _ = child.kill();
                let _ = child.wait();
                panic!("unexpected first line: {line:?}")
            }
        }
    }

    /// `hoox-load ledger`, the executor that remembers.
    fn ledger() -> Server {
        let args = ["ledger", "--listen", "127.0.0.1:0"];
        Server::start(LOAD, &args, "hoox-load: ledger on http://")
    }

    fn orders(&self) -> String {
        format!("http://{}/orders", self.addr)
    }

    fn counts(&self) -> String {
        format!("http://{}/ledger", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one `hoox-load` command printed and how it exited.
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Outcome {
    /// The JSON object printed on line `n` (0-based).
    fn json(&self, n: usize) -> Value {
        let line = self.stdout.lines().nth(n).unwrap_or_else(|| {
            panic!("no line {n} in {:?}", self.stdout);
        });
        serde_json::from_str(line).unwrap()
    }
}

/// Runs `hoox-load` with the words of `line` as its arguments (no path here has a space);
/// what it wrote to stderr is for the caller to judge.
async fn load_with_stderr(line: &str) -> Outcome {
    let out = tokio::process::Command::new(LOAD)
        .args(line.split_whitespace())
        .output()
        .await
        .unwrap();
    Outcome {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Asserts `hoox-load LINE` refuses to run (exit 2), saying `why` on stderr.
async fn assert_refused(line: &str, why: &str) {
    let out = load_with_stderr(line).await;
    assert_eq!(out.code, Some(2), "{line}: {}", out.stdout);
    assert!(out.stderr.contains(why), "{line}: {}", out.stderr);
}

/// Runs `hoox-load LINE`, which must write nothing to stderr.
async fn load(line: &str) -> Outcome {
    let out = load_with_stderr(line).await;
    assert!(out.stderr.is_empty(), "hoox-load {line}: {}", out.stderr);
    out
}

/// A gateway that forwards to `ledger`.
fn forwarding_to(ledger: &Server) -> Setup {
    let mut setup = Setup::new(Some(&ledger.orders()));
    setup.set("executor", "timeout", "10s");
    setup
}

/// What `hoox-load run --ledger … --json` printed and how it exited.
struct Run {
    code: Option<i32>,
    /// The run's own report: statuses, latency, errors.
    report: Value,
    /// The ledger's counts at the end, and whether any key was forwarded twice.
    verdict: Value,
}

/// The words of `hoox-load run` against `gw` (whose CA is `setup`'s), authenticated by
/// `auth` with the secret file `secret`, reporting in JSON, then `extra`.
fn run_line(setup: &Setup, gw: &Gateway, auth: &str, secret: &Path, extra: &str) -> String {
    format!(
        "run --url {} --ca {} --auth {auth} --secret-file {} --json {extra}",
        gw.url(),
        setup.pki.ca_cert.display(),
        secret.display()
    )
}

/// `hoox-load run` against `setup`'s gateway, HMAC-signed, its keys from `prefix` (runs that
/// share it share keys), checking `ledger` at the end.
async fn run(setup: &Setup, gw: &Gateway, ledger: &Server, prefix: &str, extra: &str) -> Run {
    let secret = setup.dir.path().join("load-secret");
    write_secret(&secret, SECRET);
    let counts = ledger.counts();
    let extra = format!("--ledger {counts} --key-prefix {prefix} {extra}");
    let out = load(&run_line(setup, gw, "hmac", &secret, &extra)).await;
    Run {
        code: out.code,
        report: out.json(0),
        verdict: out.json(1),
    }
}

/// The count of answers with `status` in a run's report.
fn answered(report: &Value, status: &str) -> u64 {
    report["status"][status].as_u64().unwrap_or(0)
}

/// A run of `requests` at `--dup-ratio 0.5` on a fresh ledger: only 200s and 409s, about
/// as many of each, and the ledger took each 200 once. How many were forwarded.
fn half_repeats_forwarded_once(run: &Run, requests: u64) -> u64 {
    let (report, verdict) = (&run.report, &run.verdict);
    assert_eq!(run.code, Some(0), "{report} {verdict}");
    assert_eq!(report["responses"], requests, "{report}");
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
    let (forwarded, refused) = (answered(report, "200"), answered(report, "409"));
    assert_eq!(
        forwarded + refused,
        requests,
        "only 200 and 409 expected: {report}"
    );
    // requests - 1 draws at even odds (the first request has nothing to repeat): half of
    // them repeats on average, with a standard deviation of sqrt(draws) / 2. The bounds
    // are five of those.
    let draws = (requests - 1) as f64;
    let spread = 5.0 * draws.sqrt() / 2.0;
    let expected = (draws / 2.0 - spread)..=(draws / 2.0 + spread);
    assert!(expected.contains(&(refused as f64)), "{report}");
    assert_eq!(verdict["ledger"]["total"], forwarded, "{verdict}");
    assert_eq!(verdict["ledger"]["unique"], forwarded, "{verdict}");
    assert_eq!(verdict["no_key_forwarded_twice"], true, "{verdict}");
    forwarded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_tool_passes_a_gateway_that_forwards_once_and_catches_one_that_forgot() {
    let ledger = Server::ledger();
    let setup = forwarding_to(&ledger);
    let mut gw = setup.start();
    gw.wait_ready().await;

    // 1. Half the requests repeat an earlier trade: each trade is forwarded once.
    let first = run(
        &setup,
        &gw,
        &ledger,
        "sized",
        "-c 4 --requests 400 --dup-ratio 0.5",
    )
    .await;
    let forwarded = half_repeats_forwarded_once(&first, 400);

    // A storm: 200 requests drawn from 5 keys. Each key is forwarded once.
    let storm = run(
        &setup,
        &gw,
        &ledger,
        "storm",
        "-c 8 --requests 200 --keys 5",
    )
    .await;
    assert_eq!(storm.code, Some(0), "{} {}", storm.report, storm.verdict);
    assert_eq!(answered(&storm.report, "200"), 5, "{}", storm.report);
    assert_eq!(answered(&storm.report, "409"), 195, "{}", storm.report);
    let forwarded = forwarded + 5;
    assert_eq!(
        storm.verdict["ledger"]["unique"], forwarded,
        "{}",
        storm.verdict
    );

    // 2. The first 50 trades again, after a restart: every one is refused, none forwarded.
    let replay = "-c 2 --requests 50";
    assert!(gw.terminate().success());
    let mut gw = setup.start();
    gw.wait_ready().await;
    let again = run(&setup, &gw, &ledger, "sized", replay).await;
    assert_eq!(again.code, Some(0), "{} {}", again.report, again.verdict);
    assert_eq!(answered(&again.report, "409"), 50, "{}", again.report);
    assert_eq!(
        again.verdict["ledger"]["total"], forwarded,
        "{}",
        again.verdict
    );
    assert!(gw.terminate().success());

    // 3. A gateway on an empty database has forgotten them: it forwards them again, and
    // both of the tool's checks say so.
    let forgetful = forwarding_to(&ledger);
    let gw = forgetful.start();
    gw.wait_ready().await;
    let forgot = run(&forgetful, &gw, &ledger, "sized", replay).await;
    let (report, verdict) = (&forgot.report, &forgot.verdict);
    assert_eq!(forgot.code, Some(1), "{report} {verdict}");
    assert_eq!(answered(&forgot.report, "200"), 50, "{report}");
    assert_eq!(verdict["no_key_forwarded_twice"], false, "{verdict}");
    let twice = verdict["ledger"]["duplicates"].as_array().unwrap();
    assert_eq!(twice.len(), 50, "{verdict}");
    assert!(
        twice.iter().all(|k| k.as_str().unwrap().contains("sized")),
        "{verdict}"
    );

    let check = load(&format!("check-ledger --ledger {}", ledger.counts())).await;
    assert_eq!(check.code, Some(1), "{}", check.stdout);
    assert!(
        check
            .stdout
            .contains("50 keys forwarded twice\nledger: FAIL, keys forwarded twice: "),
        "{}",
        check.stdout
    );
}

/// Trades without a key (`--keyless`), as a sender that sends none: each forwarded once,
/// told apart by its fingerprint alone; a repeat within the minute, in the run or in the
/// next one, refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_trades_are_told_apart_by_their_fingerprints() {
    let ledger = Server::ledger();
    let setup = forwarding_to(&ledger);
    let gw = setup.start();
    gw.wait_ready().await;
    let first = run(
        &setup,
        &gw,
        &ledger,
        "nokey",
        "-c 4 --requests 200 --dup-ratio 0.5 --keyless",
    )
    .await;
    let forwarded = half_repeats_forwarded_once(&first, 200);
    assert_eq!(
        first.verdict["ledger"]["missing_key"], 0,
        "{}",
        first.verdict
    );
    // The same trades again, within the minute: every one a duplicate of its fingerprint.
    let again = run(
        &setup,
        &gw,
        &ledger,
        "nokey",
        "-c 2 --requests 50 --keyless",
    )
    .await;
    assert_eq!(again.code, Some(0), "{} {}", again.report, again.verdict);
    assert_eq!(answered(&again.report, "409"), 50, "{}", again.report);
    assert_eq!(
        again.verdict["ledger"]["total"], forwarded,
        "{}",
        again.verdict
    );
    // The gateway saw no client key: its live keys are fingerprints (and the signatures'
    // guards, `sig:`).
    let (status, keys) = gw.admin("GET", "/keys?limit=10000").await;
    assert_eq!(status, 200, "{keys}");
    let keys: Vec<&str> = keys["keys"]
        .as_array()
        .expect("a list of keys")
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    let trades = keys
        .iter()
        .filter(|k| k.starts_with("trade:nokey:"))
        .count();
    assert_eq!(trades as u64, forwarded, "{keys:?}");
    assert!(
        keys.iter()
            .all(|k| k.starts_with("trade:") || k.starts_with("sig:")),
        "{keys:?}"
    );
    // Refused: a prefix longer than an exchange may be.
    let long = format!("--key-prefix {} --keyless --requests 1", "x".repeat(33));
    let out = load_with_stderr(&run_line(
        &setup,
        &gw,
        "hmac",
        &setup.dir.path().join("load-secret"),
        &long,
    ))
    .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("at most 32"), "{}", out.stderr);
}

/// The baseline every ratio in docs/BENCHMARKS.md divides by: it must answer every POST with
/// 200, over both protocols, closed loop and paced, or the ratios mean nothing. And the
/// report must count what happened: responses, the rate they came at, and the run's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bare_baseline_answers_every_post_over_both_protocols() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let made = load(&format!("gen-cert --dir {}", tls.display())).await;
    assert_eq!(made.code, Some(0), "{}", made.stdout);
    let (cert, key) = (tls.join("cert.pem"), tls.join("key.pem"));
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let bare = Server::start(
        BARE,
        &["--listen", "127.0.0.1:0", "--cert", cert, "--key", key],
        "bare-tls: listening on ",
    );
    let url = format!("https://127.0.0.1:{}/webhook", bare.addr.port());
    // A small JSON answer, like the gateway's: the ratios compare like with like. Only a
    // POST is a webhook.
    let client = TlsClient::new(Path::new(cert));
    let (status, headers, body) = client.post(&url, &[], "{}").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(body, serde_json::json!({"success": true}));
    let get = client.request(Method::GET, &url, &[], "").await;
    assert_eq!(get.status, 405);

    for (bound, h2, paced) in [
        ("--http1 --requests 150", false, false),
        ("--http2 --requests 150", true, false),
        ("--rate 2000/s --requests 150", false, true),
        ("--duration 300ms", false, false),
    ] {
        let out = load(&format!("run --url {url} --ca {cert} -c 3 --json {bound}")).await;
        assert_eq!(out.code, Some(0), "{bound}: {}", out.stdout);
        let report = out.json(0);
        let responses = report["responses"].as_u64().unwrap();
        assert_eq!(answered(&report, "200"), responses, "{bound}: {report}");
        assert_eq!(report["failed_handshakes"], 0, "{bound}: {report}");
        let elapsed = report["elapsed_s"].as_f64().unwrap();
        // Every answer is a 200, so every one is served.
        assert_eq!(report["served"], responses, "{bound}: {report}");
        if bound.ends_with("150") {
            assert_eq!(responses, 150, "{bound}: {report}");
        } else {
            assert!(responses > 0 && (0.3..10.0).contains(&elapsed), "{report}");
        }
        assert_eq!(report["protocol"] == "h2", h2, "{bound}: {report}");
        assert_eq!(!report["generator"].is_null(), paced, "{bound}: {report}");
    }
}

/// What goes wrong is reported, not hidden: a URL nothing listens on and a bad key prefix
/// are refused before the run (exit 2, and why); requests that time out are counted by kind,
/// and a run with no response at all exits 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_tool_reports_what_failed() {
    let setup = Setup::new(None);
    let (ca, closed) = (
        setup.pki.ca_cert.display(),
        support::executor::refused_url(),
    );
    let closed = closed.replace("http://", "https://");
    let nobody = format!("run --url {closed} --ca {ca} --requests 1");
    assert_refused(&nobody, "cannot connect to").await;
    // A ledger that cannot be read is said before the run, naming it, not after.
    let ledger = support::executor::refused_url().replace("/orders", "/ledger");
    let why = format!("ledger {ledger}: ");
    assert_refused(&format!("{nobody} --ledger {ledger}"), &why).await;
    // A server that takes the connection and never finishes its handshake ends the run
    // within --timeout, rather than hang it.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mute = format!("https://{}/webhook", mute.local_addr().unwrap());
    let hung = format!("run --url {mute} --ca {ca} --requests 1 --timeout 300ms");
    assert_refused(&hung, "no handshake within 300ms").await;
    // Numbers out of range, and a flag that does nothing alone, are refused before any
    // request: not a panic, an hours-long wait, or a storm run as unique keys.
    let empty = setup.dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    for (extra, why) in [
        (
            "--rate 1e-300",
            "rate must be a number per second from 0.01",
        ),
        (
            "--rate 0.001/s",
            "rate must be a number per second from 0.01",
        ),
        ("--keys 0", "--keys"),
        (
            "--duration 10000000000000000000s",
            "--duration: at most a year",
        ),
        ("--secret-file /nonexistent", "--auth"),
        // Nothing to measure: said, not an empty report.
        ("--duration 0s", "must be more than 0"),
        ("--timeout 0ms", "must be more than 0"),
        ("--requests 0", "--requests"),
    ] {
        let line = format!("run --url {closed} --ca {ca} {extra}").replace("--requests 1", "");
        assert_refused(&line, why).await;
    }
    let line = format!("run --url {closed} --ca {} --requests 1", empty.display());
    assert_refused(&line, "empty.pem: no certificate in it").await;
    let fsync = format!("fsync --dir {}", setup.dir.path().display());
    for (extra, why) in [
        (
            "--size 99999999999",
            "--size must be from 1 to 1048576 bytes",
        ),
        ("--count 0", "--count"),
        ("--rate 1e-300", "rate must be"),
    ] {
        assert_refused(&format!("{fsync} {extra}"), why).await;
    }
    let missing = setup.dir.path().join("missing");
    let why = format!("{}: No such file", missing.display());
    assert_refused(
        &format!("fsync --dir {} --count 1", missing.display()),
        &why,
    )
    .await;

    // An executor that takes the order and never answers: every webhook outlives the
    // tool's own timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!("http://{}/orders", silent.local_addr().unwrap());
    let mut setup = Setup::new(Some(&silent));
    setup.set("executor", "timeout", "10s");
    let gw = setup.start();
    gw.wait_ready().await;
    let secret = setup.dir.path().join("load-secret");
    write_secret(&secret, SECRET);
    let line = format!(
        "run --url {} --ca {} -c 2 --requests 4 --timeout 300ms --auth bearer --secret-file {}",
        gw.url(),
        setup.pki.ca_cert.display(),
        secret.display()
    );
    let bad = format!("{line} --key-prefix no/slashes");
    assert_refused(&bad, "--key-prefix: at most 200 of").await;

    let json = load(&format!("{line} --json")).await;
    let report = json.json(0);
    assert_eq!(json.code, Some(3), "{report}");
    assert_eq!(report["responses"], 0, "{report}");
    assert_eq!(
        report["errors"],
        serde_json::json!({"timeout": 4}),
        "{report}"
    );
    let text = load(&line).await;
    assert_eq!(text.code, Some(3), "{}", text.stdout);
    let counted = "errors     timeout x 4 (failed initial handshakes: 0)";
    assert!(text.stdout.contains(counted), "{}", text.stdout);
}

/// A slow open loop over many connections leaves each idle past the gateway's
/// `header_timeout`, which closes it: the next request on it goes out on a new connection.
/// Counted as failed, it made a healthy gateway look broken (exit 4, "io" errors) and
/// dropped the request unsent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_gateway_closed_while_idle_are_made_again_not_counted_as_failures() {
    let mut setup = Setup::new(None);
    setup.set("server", "header_timeout", "1s");
    let gw = setup.start();
    gw.wait_ready().await;
    let secret = setup.dir.path().join("load-secret");
    write_secret(&secret, SECRET);
    for protocol in ["", "--http2"] {
        // One request every 2 s: the connection sits idle past the timeout before each.
        let extra = format!("-c 1 --rate 0.5/s --requests 3 {protocol}");
        let out = load(&run_line(&setup, &gw, "bearer", &secret, &extra)).await;
        let report = out.json(0);
        assert_eq!(out.code, Some(0), "{protocol}: {report}");
        assert_eq!(answered(&report, "200"), 3, "{protocol}: {report}");
        assert_eq!(
            report["errors"],
            serde_json::json!({}),
            "{protocol}: {report}"
        );
    }
}

/// Runs `hoox-load run` against `gw` with `auth` and the secret file holding `secret_text`,
/// `-c 2 --requests 20` and `extra`: its exit code and report.
async fn run_with_secret(
    setup: &Setup,
    gw: &Gateway,
    auth: &str,
    secret_text: &str,
    extra: &str,
) -> (Option<i32>, Value) {
    let secret = setup.dir.path().join(format!("load-secret-{auth}"));
    write_secret(&secret, secret_text);
    let extra = format!("-c 2 --requests 20 {extra}");
    let out = load(&run_line(setup, gw, auth, &secret, &extra)).await;
    (out.code, out.json(0))
}

/// An answer is not throughput unless the gateway served it: a wrong secret gets 401 for
/// everything, which must exit nonzero (4) with nothing served, unless the run says errors are
/// expected. And the secret file is read as the gateway reads its own: comments and blank
/// lines skipped, so a rotated file with a note on top works with every method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_answers_are_not_throughput_and_secret_files_read_as_the_gateway_does() {
    let setup = Setup::new(None);
    let gw = setup.start();
    gw.wait_ready().await;

    for auth in ["hmac", "bearer"] {
        let (code, report) = run_with_secret(&setup, &gw, auth, "wrong-secret\n", "").await;
        assert_eq!(code, Some(4), "{auth}: {report}");
        assert_eq!(answered(&report, "401"), 20, "{auth}: {report}");
        assert_eq!(report["responses"], 20, "{auth}: {report}");
        assert_eq!(report["served"], 0, "{auth}: {report}");
        assert_eq!(
            report["throughput_rps"].as_f64(),
            Some(0.0),
            "{auth}: {report}"
        );
        assert!(report["answers_rps"].as_f64().unwrap() > 0.0, "{report}");
        // Chaos runs kill the gateway on purpose: there, errors are part of the plan.
        let (code, report) =
            run_with_secret(&setup, &gw, auth, "wrong-secret\n", "--expect-errors").await;
        assert_eq!(code, Some(0), "{auth}: {report}");

        let rotated = format!("# rotated\n\n{SECRET}\n");
        let (code, report) = run_with_secret(&setup, &gw, auth, &rotated, "").await;
        assert_eq!(code, Some(0), "{auth}: {report}");
        assert_eq!(answered(&report, "200"), 20, "{auth}: {report}");
        assert_eq!(report["served"], 20, "{auth}: {report}");
        assert!(report["throughput_rps"].as_f64().unwrap() > 0.0, "{report}");
    }
}

/// The keys that got a 2xx, written one per line (appended across runs, keys only): the set
/// the chaos bench replays after its last restart. Replayed after a restart, every one is
/// refused as a duplicate, and the ledger sees no new order. Replayed to a gateway that has
/// forgotten them, the tool fails the run by itself, with no ledger to tell it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keys_that_got_a_2xx_are_written_and_replay_as_duplicates() {
    let ledger = Server::ledger();
    let setup = forwarding_to(&ledger);
    let mut gw = setup.start();
    gw.wait_ready().await;
    let keys = setup.dir.path().join("ok-keys");
    let keys = keys.display();

    let first = run(
        &setup,
        &gw,
        &ledger,
        "first",
        &format!("-c 4 --requests 200 --dup-ratio 0.5 --write-2xx-keys {keys}"),
    )
    .await;
    assert_eq!(first.code, Some(0), "{} {}", first.report, first.verdict);
    let ok_first = answered(&first.report, "200");
    let second = run(
        &setup,
        &gw,
        &ledger,
        "second",
        &format!("-c 2 --requests 30 --write-2xx-keys {keys}"),
    )
    .await;
    assert_eq!(answered(&second.report, "200"), 30, "{}", second.report);

    let text = std::fs::read_to_string(setup.dir.path().join("ok-keys")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len() as u64, ok_first + 30, "{text}");
    let unique: std::collections::BTreeSet<&str> = lines.iter().copied().collect();
    assert_eq!(unique.len(), lines.len(), "a key written twice: {text}");
    assert_eq!(
        lines.iter().filter(|k| k.starts_with("first-")).count() as u64,
        ok_first
    );
    assert!(
        lines
            .iter()
            .all(|k| k.starts_with("first-") || k.starts_with("second-"))
    );
    assert_eq!(
        first.verdict["ledger"]["total"], ok_first,
        "{}",
        first.verdict
    );
    let forwarded = ok_first + 30;

    assert!(gw.terminate().success());
    let gw = setup.start();
    gw.wait_ready().await;
    let again = run(
        &setup,
        &gw,
        &ledger,
        "unused",
        &format!("-c 3 --replay-keys {keys}"),
    )
    .await;
    assert_eq!(again.code, Some(0), "{} {}", again.report, again.verdict);
    assert_eq!(again.report["responses"], forwarded, "{}", again.report);
    assert_eq!(
        answered(&again.report, "409"),
        forwarded,
        "{}",
        again.report
    );
    assert_eq!(
        again.verdict["ledger"]["total"], forwarded,
        "{}",
        again.verdict
    );

    // Halted, the same gateway answers each 503: nothing forwarded, and nothing shown held
    // either. A replay proves each key held or fails, --expect-errors or not: exit 6.
    let (s, _) = gw.admin("POST", "/halt").await;
    assert_eq!(s, 200);
    let secret = setup.dir.path().join("load-secret");
    let halted = format!("-c 3 --expect-errors --replay-keys {keys}");
    // A replay that failed: its exit `code`, every key answered `status`, and `says`.
    let failed = |out: &Outcome, code: i32, status: &str, says: &str| {
        assert_eq!(out.code, Some(code), "{} {}", out.stdout, out.stderr);
        assert_eq!(answered(&out.json(0), status), forwarded, "{}", out.stdout);
        let said = format!("replay: FAIL, {forwarded} of {forwarded} replayed keys {says}");
        assert!(out.stderr.contains(&said), "{}", out.stderr);
    };
    let out = load_with_stderr(&run_line(&setup, &gw, "hmac", &secret, &halted)).await;
    failed(&out, 6, "503", "not shown held");

    // A gateway on an empty database forwards them again: exit 5, said, and no ledger asked.
    let forgetful = forwarding_to(&ledger);
    let fresh = forgetful.start();
    fresh.wait_ready().await;
    let replay = format!("-c 3 --replay-keys {keys}");
    let out = load_with_stderr(&run_line(&forgetful, &fresh, "hmac", &secret, &replay)).await;
    failed(&out, 5, "200", "answered 2xx");

    // A gateway that answers a duplicate with its stored answer (a 2xx marked
    // Idempotent-Replayed): replayed keys are not forwarded again, and the run passes.
    let mut replaying = forwarding_to(&ledger);
    replaying.set("server", "duplicate_response", "replay");
    let gw = replaying.start();
    gw.wait_ready().await;
    let stored = replaying.dir.path().join("stored-keys");
    let line = |extra: &str| run_line(&replaying, &gw, "hmac", &secret, &format!("-c 2 {extra}"));
    let first = load(&line(&format!(
        "--requests 20 --key-prefix stored --write-2xx-keys {}",
        stored.display()
    )))
    .await;
    assert_eq!(first.code, Some(0), "{}", first.stdout);
    let again = load(&line(&format!("--replay-keys {}", stored.display()))).await;
    let report = again.json(0);
    assert_eq!(again.code, Some(0), "{report}");
    assert_eq!(answered(&report, "200"), 20, "{report}");
    assert_eq!(report["replayed"], 20, "{report}");
}

/// A TLS server that answers `200 {"success":true}` at once, except request number `stall_at`
/// (0-based), which it holds for `stall` first. Served until the test ends.
async fn stalling_server(cert: &Path, key: &Path, stall_at: u64, stall: Duration) -> String {
    use http_body_util::{BodyExt, Full};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/webhook", listener.local_addr().unwrap());
    let count = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, count) = (acceptor.clone(), count.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let n = count.fetch_add(1, Ordering::Relaxed);
                        async move {
                            req.into_body().collect().await?;
                            if n == stall_at {
                                tokio::time::sleep(stall).await;
                            }
                            let body = bytes::Bytes::from_static(b"{\"success\":true}");
                            Ok::<_, hyper::Error>(hyper::Response::new(Full::new(body)))
                        }
                    },
                );
                let io = hyper_util::rt::TokioIo::new(tls);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    url
}

/// Writes the bench certificate into a fresh folder: (folder, cert, key).
async fn bench_cert() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let made = load(&format!("gen-cert --dir {}", tls.display())).await;
    assert_eq!(made.code, Some(0), "{}", made.stdout);
    (dir, tls.join("cert.pem"), tls.join("key.pem"))
}

/// A ledger that answers its first read and is gone for the next: the run's report and its
/// keys come before the ledger is read at the end, so its failure loses neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_lost_during_the_run_loses_neither_report_nor_keys() {
    use std::io::{Read, Write};
    let (dir, cert, key) = bench_cert().await;
    let url = stalling_server(&cert, &key, u64::MAX, Duration::ZERO).await;
    let once = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ledger = format!("http://{}/ledger", once.local_addr().unwrap());
    std::thread::spawn(move || {
        let (mut tcp, _) = once.accept().unwrap();
        let mut head = [0u8; 1024];
        let _ = tcp.read(&mut head);
        let body = r#"{"total":0,"unique":0,"duplicates":[]}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(answer.as_bytes()).unwrap();
        // The listener goes with the thread: the second read is refused.
    });
    let keys = dir.path().join("keys");
    let out = load_with_stderr(&format!(
        "run --url {url} --ca {} -c 1 --requests 5 --json --ledger {ledger} --write-2xx-keys {}",
        cert.display(),
        keys.display()
    ))
    .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("ledger {ledger}: ")),
        "{}",
        out.stderr
    );
    assert_eq!(answered(&out.json(0), "200"), 5, "{}", out.stdout);
    let written = std::fs::read_to_string(&keys).unwrap();
    assert_eq!(written.lines().count(), 5, "{written}");
}

/// Open loop: latency counts from each request's place on the schedule. The server holds its
/// first answer 300 ms; over one connection at 1000/s, the requests due meanwhile wait for
/// it, and that wait is theirs: measured from when each went out it would be ~0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_latency_counts_from_the_schedule() {
    let (_dir, cert, key) = bench_cert().await;
    let url = stalling_server(&cert, &key, 0, Duration::from_millis(300)).await;
    let out = load(&format!(
        "run --url {url} --ca {} -c 1 --rate 1000/s --requests 300 --json",
        cert.display()
    ))
    .await;
    let report = out.json(0);
    assert_eq!(out.code, Some(0), "{report}");
    assert_eq!(answered(&report, "200"), 300, "{report}");
    let p50 = report["latency_us"]["p50"].as_u64().unwrap();
    assert!(p50 >= 100_000, "p50 {p50} us: {report}");
    // Whether the pacer got real-time priority is said, either way.
    assert!(
        report["generator"]["pacer_realtime"].is_boolean(),
        "{report}"
    );
}

/// Closed loop over a --duration window: a straggler held past the window's end (here 3 s,
/// well within --timeout) does not stretch the time the throughput is divided by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_straggler_does_not_stretch_a_timed_run() {
    let (_dir, cert, key) = bench_cert().await;
    let url = stalling_server(&cert, &key, 20, Duration::from_secs(3)).await;
    let out = load(&format!(
        "run --url {url} --ca {} -c 2 --duration 1s --json",
        cert.display()
    ))
    .await;
    let report = out.json(0);
    assert_eq!(out.code, Some(0), "{report}");
    // The run did wait for the straggler, 3 s, but divides by its 1 s window: every answer
    // came within it but the last of each connection (the straggler, and at most one in
    // flight on the other when the window closed). Divided by the wall time, req/s would
    // be a third of that.
    assert!(report["wall_s"].as_f64().unwrap() >= 3.0, "{report}");
    let responses = report["responses"].as_f64().unwrap();
    let rps = report["throughput_rps"].as_f64().unwrap();
    assert!(rps >= responses - 2.5, "{report}");
    // The straggler answered after the window closed: it is not counted in it.
    assert!(rps <= responses - 1.0, "{report}");
}
