//! The load tool end to end, as `scripts/bench.sh` uses it: `hoox-load run` drives the real
//! gateway over TLS, the gateway forwards to `hoox-load ledger`, and the ledger's verdict is
//! what a user sizing a box trusts. So it must hold both ways: a run with repeated trades, and
//! a replay after a restart, are passed; a gateway that lost its state and forwards the same
//! trades again is caught, by `run --ledger` and by `check-ledger`.

mod support;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

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
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .parse()
            .unwrap();
        Server { child, addr }
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

async fn load(args: Vec<String>) -> Outcome {
    let out = tokio::process::Command::new(LOAD)
        .args(&args)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.is_empty(),
        "hoox-load {args:?} wrote to stderr: {stderr}"
    );
    Outcome {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
    }
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

impl Run {
    /// The count of answers with `status`.
    fn answered(&self, status: &str) -> u64 {
        answered(&self.report, status)
    }
}

/// `hoox-load run` against `setup`'s gateway, HMAC-signed, every run's keys from the same
/// prefix, checking `ledger` at the end.
async fn run(setup: &Setup, gw: &Gateway, ledger: &Server, extra: &[&str]) -> Run {
    let secret = setup.dir.path().join("load-secret");
    write_secret(&secret, SECRET);
    let ca = setup.pki.ca_cert.display().to_string();
    let secret = secret.display().to_string();
    let counts = ledger.counts();
    let url = gw.url();
    let args = [
        "run",
        "--url",
        &url,
        "--ca",
        &ca,
        "--auth",
        "hmac",
        "--secret-file",
        &secret,
        "--ledger",
        &counts,
        "--json",
        "--key-prefix",
        "sized",
    ];
    let args = args.iter().chain(extra);
    let out = load(args.map(|s| s.to_string()).collect()).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_tool_passes_a_gateway_that_forwards_once_and_catches_one_that_forgot() {
    let ledger = Server::ledger();
    let setup = forwarding_to(&ledger);
    let mut gw = setup.start();
    gw.wait_ready().await;

    // 1. Half the requests repeat an earlier trade: each trade is forwarded once.
    let args = ["-c", "4", "--requests", "400", "--dup-ratio", "0.5"];
    let first = run(&setup, &gw, &ledger, &args).await;
    let (report, verdict) = (&first.report, &first.verdict);
    assert_eq!(first.code, Some(0), "{report} {verdict}");
    assert_eq!(report["responses"], 400, "{report}");
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
    let (forwarded, refused) = (first.answered("200"), first.answered("409"));
    assert_eq!(
        forwarded + refused,
        400,
        "only 200 and 409 expected: {report}"
    );
    assert!(refused > 0 && forwarded > 0, "{report}");
    assert_eq!(verdict["ledger"]["total"], forwarded, "{verdict}");
    assert_eq!(verdict["ledger"]["unique"], forwarded, "{verdict}");
    assert_eq!(verdict["no_key_forwarded_twice"], true, "{verdict}");

    // 2. The first 50 trades again, after a restart: every one is refused, none forwarded.
    let replay = ["-c", "2", "--requests", "50"];
    assert!(gw.terminate().success());
    let mut gw = setup.start();
    gw.wait_ready().await;
    let again = run(&setup, &gw, &ledger, &replay).await;
    assert_eq!(again.code, Some(0), "{} {}", again.report, again.verdict);
    assert_eq!(again.answered("409"), 50, "{}", again.report);
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
    let forgot = run(&forgetful, &gw, &ledger, &replay).await;
    let (report, verdict) = (&forgot.report, &forgot.verdict);
    assert_eq!(forgot.code, Some(1), "{report} {verdict}");
    assert_eq!(forgot.answered("200"), 50, "{report}");
    assert_eq!(verdict["no_key_forwarded_twice"], false, "{verdict}");
    let twice = verdict["ledger"]["duplicates"].as_array().unwrap();
    assert_eq!(twice.len(), 50, "{verdict}");
    assert!(
        twice.iter().all(|k| k.as_str().unwrap().contains("sized")),
        "{verdict}"
    );

    let check = load(vec![
        "check-ledger".into(),
        "--ledger".into(),
        ledger.counts(),
    ])
    .await;
    assert_eq!(check.code, Some(1), "{}", check.stdout);
    assert!(
        check
            .stdout
            .contains("50 keys forwarded twice\nledger: FAIL, keys forwarded twice: "),
        "{}",
        check.stdout
    );
}

/// The baseline every ratio in docs/BENCHMARKS.md divides by: it must answer every POST with
/// 200, over both protocols, closed loop and paced, or the ratios mean nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bare_baseline_answers_every_post_over_both_protocols() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let made = load(vec![
        "gen-cert".into(),
        "--dir".into(),
        tls.display().to_string(),
    ])
    .await;
    assert_eq!(made.code, Some(0), "{}", made.stdout);
    let (cert, key) = (tls.join("cert.pem"), tls.join("key.pem"));
    let bare = Server::start(
        BARE,
        &[
            "--listen",
            "127.0.0.1:0",
            "--cert",
            cert.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ],
        "bare-tls: listening on ",
    );
    let url = format!("https://127.0.0.1:{}/webhook", bare.addr.port());
    // A small JSON answer, like the gateway's: the ratios compare like with like. Only a
    // POST is a webhook.
    let client = TlsClient::new(&cert);
    let (status, headers, body) = client.post(&url, &[], "{}").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(body, serde_json::json!({"success": true}));
    let get = client.request(Method::GET, &url, &[], "").await;
    assert_eq!(get.status, 405);
    for extra in [&["--http1"][..], &["--http2"], &["--rate", "2000/s"]] {
        let cert = cert.to_str().unwrap();
        let args = [
            "run",
            "--url",
            &url,
            "--ca",
            cert,
            "-c",
            "3",
            "--requests",
            "150",
        ];
        let args = args.iter().chain(&["--json"]).chain(extra);
        let out = load(args.map(|s| s.to_string()).collect()).await;
        assert_eq!(out.code, Some(0), "{extra:?}: {}", out.stdout);
        let report = out.json(0);
        assert_eq!(answered(&report, "200"), 150, "{extra:?}: {report}");
        assert_eq!(report["responses"], 150, "{extra:?}: {report}");
        let h2 = report["protocol"] == "h2";
        assert_eq!(h2, extra[0] == "--http2", "{extra:?}: {report}");
        let paced = !report["generator"].is_null();
        assert_eq!(paced, extra[0] == "--rate", "{extra:?}: {report}");
    }
}
