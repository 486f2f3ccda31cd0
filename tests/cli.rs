//! The operator's command line against a running gateway: `status`, `keys list|show|release`,
//! `halt`, `resume`, over TCP and over the Unix socket; and the offline commands `gen-cert`,
//! `sign`, `check-config`.

mod support;

use std::process::{Command, Output};

use serde_json::{Value, json};
use support::executor::{MockExecutor, Mode};
use support::gateway::{BIN, SECRET, Setup, trade};

fn cli(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn json_out(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "{:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_releases_a_held_key_and_halts() {
    let exec = MockExecutor::start().await;
    let mut setup = Setup::new(Some(&exec.url()));
    let sock = setup.dir.path().join("admin.sock");
    setup.set("admin", "listen", format!("unix:{}", sock.display()));
    let gw = setup.start();
    gw.wait_ready().await;
    let config = setup.config_path();
    let config = config.to_str().unwrap();
    // Through the config's [admin] (the Unix socket), as an operator on the box would.
    let admin = ["--config", config];

    // An order whose outcome is unknown holds its key.
    exec.set_mode(Mode::Hang);
    let mut t = trade("BTCUSDT");
    t["idempotencyKey"] = json!("held-1");
    assert_eq!(gw.post(&t, &[]).await.status, 504);
    let key = "client:psk:live:held-1";

    let status = json_out(&cli(&[&["status"][..], &admin].concat()));
    assert_eq!(status["live_keys"], 1);
    assert_eq!(status["halted"], false);
    let list = json_out(&cli(&[&["keys", "list"][..], &admin].concat()));
    assert_eq!(list["keys"][0]["key"], key);
    assert_eq!(list["keys"][0]["state"], "pending");
    let show = json_out(&cli(&[&["keys", "show", key][..], &admin].concat()));
    assert_eq!(show["state"], "pending");

    // The operator checked the exchange: nothing filled. Release, and the retry runs.
    let rel = json_out(&cli(&[&["keys", "release", key][..], &admin].concat()));
    assert_eq!(rel["released"], true);
    let again = cli(&[&["keys", "show", key][..], &admin].concat());
    assert!(!again.status.success(), "a released key is still shown");
    exec.set_mode(Mode::Success);
    assert_eq!(gw.post(&t, &[]).await.status, 200);
    assert_eq!(exec.calls(), 2);

    // Kill switch from the command line.
    json_out(&cli(&[&["halt"][..], &admin].concat()));
    let r = gw.post(&trade("ETHUSDT"), &[]).await;
    assert_eq!(r.json()["code"], "KILL_SWITCH");
    assert_eq!(
        json_out(&cli(&[&["status"][..], &admin].concat()))["halted"],
        true
    );
    json_out(&cli(&[&["resume"][..], &admin].concat()));
    assert_eq!(gw.post(&trade("ETHUSDT"), &[]).await.status, 200);

    // Nobody there: a clear error and EX_UNAVAILABLE.
    let o = cli(&["status", "--admin", "127.0.0.1:1"]);
    assert_eq!(o.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&o.stderr).contains("admin listener"));

    // A config that names no admin listener, or cannot be read: said so, naming the file,
    // rather than trying the default address, where something else may listen.
    let bare = setup.dir.path().join("no-admin.toml");
    std::fs::write(&bare, "[store]\npath = \"x.redb\"\n").unwrap();
    let missing = setup.dir.path().join("missing.toml");
    for (file, says) in [(&bare, "no [admin]"), (&missing, "cannot read")] {
        let o = cli(&["halt", "--config", file.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(
            err.contains(says) && err.contains(file.to_str().unwrap()),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_produces_headers_the_gateway_accepts() {
    let setup = Setup::new(None);
    let gw = setup.start();
    gw.wait_ready().await;
    let body = json!({"exchange":"okx","symbol":"ETH-USDT","action":"close_long","quantity":0.5,
                      "idempotencyKey":"signed-1"})
    .to_string();
    let body_file = setup.dir.path().join("body.json");
    std::fs::write(&body_file, &body).unwrap();
    let secret_file = setup.dir.path().join("secrets/hmac");
    let o = cli(&[
        "sign",
        "--secret-file",
        secret_file.to_str().unwrap(),
        "--body-file",
        body_file.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8(o.stdout).unwrap();
    // The secret itself never appears in the output.
    assert!(!out.contains(SECRET));
    let headers: Vec<(String, String)> = out
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(": ").unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    assert_eq!(headers.len(), 2);
    // `sign` uses the file's first secret; the gateway accepts any of the rotation.
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let r = gw
        .client
        .request(hyper::Method::POST, &gw.url(), &h, body.clone())
        .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    // A tampered body with the same headers is refused.
    let r = gw
        .client
        .request(hyper::Method::POST, &gw.url(), &h, body.replace("0.5", "5"))
        .await;
    assert_eq!(r.status, 401);
}

#[test]
fn gen_cert_writes_a_loadable_private_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tls");
    let o = cli(&[
        "gen-cert",
        "--out",
        out.to_str().unwrap(),
        "--name",
        "gw.lan",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(out.join("key.pem"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "key.pem is readable by others: {mode:o}");
    let files = hoox_edge::gateway::tls::TlsFiles {
        cert: out.join("cert.pem"),
        key: out.join("key.pem"),
        client_ca: None,
    };
    assert!(files.load().is_ok());
    // A second run does not overwrite without --force.
    let o = cli(&["gen-cert", "--out", out.to_str().unwrap()]);
    assert!(!o.status.success());
    let o = cli(&["gen-cert", "--out", out.to_str().unwrap(), "--force"]);
    assert!(o.status.success());
}

#[test]
fn embedded_defaults_check_and_print_a_working_curl_line() {
    // `serve` with no config on a free port: the first run creates its state and prints the
    // line to try; the line names files that exist.
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut cmd = Command::new(BIN);
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--state-dir",
    ])
    .arg(&state)
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines: Vec<String> = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .map_while(Result::ok)
        .take(3)
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    assert!(state.join("tls/cert.pem").exists());
    assert!(state.join("secrets/curl-auth.header").exists());
    let secret = std::fs::read_to_string(state.join("secrets/secret")).unwrap();
    assert_eq!(secret.trim().len(), 64);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].starts_with("hoox-edge: gateway on https://127.0.0.1:"));
    assert!(lines[2].contains("curl --cacert") && lines[2].contains("curl-auth.header"));
    // The secret stays in its file, never in the printed command line.
    assert!(!lines[2].contains(secret.trim()));
    // The same state serves again: nothing is regenerated on the second start.
    let cert = std::fs::read(state.join("tls/cert.pem")).unwrap();
    let o = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(state.join("nope.toml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(78));
    assert_eq!(std::fs::read(state.join("tls/cert.pem")).unwrap(), cert);
}

/// The threads of a running process named `name` (`/proc/PID/task/*/comm`).
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter(|t| {
            let comm = std::fs::read_to_string(t.as_ref().unwrap().path().join("comm"));
            comm.is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_leaves_one_core_to_the_mutex_owner() {
    let setup = Setup::new(None);
    let cores = std::thread::available_parallelism().unwrap().get();
    for (env, workers) in [(None, cores.saturating_sub(1).max(1)), (Some("3"), 3)] {
        let gw = match env {
            None => setup.start(),
            Some(n) => setup.start_with(&[("TOKIO_WORKER_THREADS", n)]),
        };
        gw.wait_ready().await;
        let pid = gw.child.id();
        assert_eq!(threads_named(pid, "hoox-mutex"), 1, "the owner");
        assert_eq!(
            threads_named(pid, "tokio-rt-worker"),
            workers,
            "{cores} cores, TOKIO_WORKER_THREADS={env:?}"
        );
        drop(gw);
    }
}
