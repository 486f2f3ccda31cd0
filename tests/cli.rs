//! The operator's command line against a running gateway: `status`, `keys list|show|release`,
//! `halt`, `resume`, over TCP and over the Unix socket; and the offline commands `gen-cert`,
//! `sign`, `check-config`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use serde_json::{Value, json};
use support::client::{Reply, TlsClient};
use support::executor::{MockExecutor, Mode};
use support::gateway::{BIN, Gateway, SECRET, Setup, trade, with_mock_configured};

fn cli(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// Seconds since the epoch, by the wall clock.
fn unix_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
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

    // Not without the entry the operator judged: a usage error, nothing sent.
    let o = cli(&[&["keys", "release", key][..], &admin].concat());
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--entry"));
    assert_eq!(
        json_out(&cli(&[&["keys", "show", key][..], &admin].concat()))["state"],
        "pending"
    );
    // The operator checked the exchange: nothing filled. Release, and the retry runs.
    let tag = show["entry"].as_str().unwrap();
    let release = ["keys", "release", key, "--entry", tag];
    let rel = json_out(&cli(&[&release[..], &admin].concat()));
    assert_eq!(rel["released"], true);
    // Gone now: exit 1, the problem on stderr, nothing on stdout for a pipe to parse.
    let again = cli(&[&["keys", "show", key][..], &admin].concat());
    assert_eq!(
        again.status.code(),
        Some(1),
        "a released key is still shown"
    );
    assert!(again.stdout.is_empty());
    let err: Value = serde_json::from_slice(&again.stderr).unwrap();
    assert_eq!(err["code"], "KEY_NOT_FOUND");
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

    // Halfway through an edit elsewhere in the file, the kill switch still works: only
    // `[admin] listen` is read, the rest's error said as a warning.
    let editing = setup.dir.path().join("editing.toml");
    let text = std::fs::read_to_string(config).unwrap();
    std::fs::write(
        &editing,
        format!("{text}\n[sever]\nurl = \"http://unterminated\n"),
    )
    .unwrap();
    let editing = ["--config", editing.to_str().unwrap()];
    let o = cli(&[&["halt"][..], &editing].concat());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("line ") && err.contains("[admin] listen read alone"),
        "{err}"
    );
    assert_eq!(
        json_out(&cli(&[&["status"][..], &admin].concat()))["halted"],
        true
    );
    json_out(&cli(&[&["resume"][..], &editing].concat()));
    assert_eq!(
        json_out(&cli(&[&["status"][..], &admin].concat()))["halted"],
        false
    );

    // Nobody there: a clear error and EX_UNAVAILABLE.
    let o = cli(&["status", "--admin", "127.0.0.1:1"]);
    assert_eq!(o.status.code(), Some(69));
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(said.contains("admin listener 127.0.0.1:1: "), "{said}");
    // The webhook listener named instead of the admin one: said so, not "invalid HTTP".
    let o = cli(&["status", "--admin", &gw.addr.to_string()]);
    assert_eq!(o.status.code(), Some(69));
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(said.contains("it is not the admin listener"), "{said}");

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

/// A start that fails (here: the port is taken) fails before the database is touched: the
/// state directory is left as it was, with no database, journal or draft made and dropped
/// half-way, again at every restart systemd makes.
#[test]
fn a_failed_start_leaves_the_state_directory_untouched() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut setup = Setup::new(None);
    let port = taken.local_addr().unwrap().port();
    setup.set("server", "listen", format!("127.0.0.1:{port}"));
    let o = setup.command().output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("server.listen: cannot listen on 127.0.0.1:"),
        "{err}"
    );
    assert!(
        err.contains(&setup.config_path().display().to_string()),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(setup.dir.path().join("state"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "a failed start left {left:?}");
}

/// A listener that cannot be made is named as a config error is, by its file and its key:
/// the reason alone ("No such file or directory") named neither.
#[test]
fn an_admin_socket_that_cannot_be_made_names_its_key_and_file() {
    let mut setup = Setup::new(None);
    let sock = "unix:/nonexistent-hoox-edge-dir/admin.sock";
    setup.set("admin", "listen", sock);
    let o = setup.command().output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let file = setup.config_path().display().to_string();
    let said = format!("{file}: admin.listen: cannot listen on {sock}: ");
    assert!(err.contains(&said), "{err}");
}

/// An address given by a flag is named by the flag: the file's key may say another address,
/// or none.
#[test]
fn a_listen_flag_that_cannot_be_bound_is_named_as_the_flag() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let setup = Setup::new(None);
    for (flag, key) in [("--listen", "server.listen"), ("--admin", "admin.listen")] {
        let o = setup.command().args([flag, &addr]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!("{flag}: cannot listen on {addr}: ")),
            "{err}"
        );
        assert!(!err.contains(key), "{err}");
    }
}

/// A gateway on the database `holder`'s gateway holds (another process's lock), so failing
/// closed, with its admin on a socket in its own folder.
async fn failing_closed_beside(holder: &Setup) -> (Setup, Gateway) {
    let mut setup = Setup::new(None);
    let held = holder.dir.path().join("state/mutex.redb");
    setup.set("store", "path", held.display().to_string());
    let sock = setup.dir.path().join("admin.sock");
    setup.set("admin", "listen", format!("unix:{}", sock.display()));
    let gw = setup.start();
    gw.wait_ready_is(503).await;
    (setup, gw)
}

/// An admin face that says it runs `version` and answers every request 200 `{}`, as a
/// gateway of another version would; the request lines it got, in order. With `version`
/// empty its `/status` is `{}` too: another service, not hoox-edge.
fn admin_of_version(version: &'static str) -> (String, std::sync::Arc<Mutex<Vec<String>>>) {
    admin_answering("200 OK", version)
}

/// As [`admin_of_version`], answering every request with `status` (`"404 Not Found"`).
fn admin_answering(
    status: &'static str,
    version: &'static str,
) -> (String, std::sync::Arc<Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap().to_string();
    let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(mut tcp) = tcp else { return };
            let mut reader = BufReader::new(tcp.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            // The rest of the head, to its blank line.
            let mut rest = String::new();
            while reader.read_line(&mut rest).unwrap() > 2 {
                rest.clear();
            }
            let body = if line.starts_with("GET /status ") && !version.is_empty() {
                format!(r#"{{"version":"{version}","serving":true}}"#)
            } else if line.starts_with("POST /keys/") {
                r#"{"key":"k","released":true}"#.to_string()
            } else {
                "{}".to_string()
            };
            log.lock().unwrap().push(line.trim().to_string());
            let answer = format!(
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tcp.write_all(answer.as_bytes());
        }
    });
    (at, seen)
}

/// A folder in `dir` that everyone may write, without the sticky bit.
fn open_folder(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let open = dir.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    open
}

/// A config error under the embedded defaults names the state folder, not a config.toml
/// in it that does not exist.
#[test]
fn an_embedded_defaults_error_names_no_file_that_is_not_there() {
    let dir = tempfile::tempdir().unwrap();
    let open = open_folder(dir.path());
    let o = output_within({
        let mut c = Command::new(BIN);
        c.args(["serve", "--state-dir", open.to_str().unwrap()])
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]);
        c
    });
    let said = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{said}");
    let named = format!("config error: {} (embedded defaults): ", open.display());
    assert!(
        said.contains(&named) && !said.contains("config.toml"),
        "{said}"
    );
}

/// A state folder another user made (a first run under sudo), run by this one: the error
/// says whose folder it may be and the way out, not `server.cert`'s "Permission denied"
/// of a certificate made again over the one it could not look at.
#[test]
fn an_embedded_state_folder_of_another_user_is_named_as_such() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    let run = |uid: u32| {
        output_within({
            let mut c = Command::new(BIN);
            c.args(["serve", "--state-dir", state.to_str().unwrap()])
                .args(["--listen", "192.0.2.1:8443", "--admin", "127.0.0.1:0"])
                .uid(uid)
                .gid(uid);
            c
        })
    };
    // Made by root (it then cannot bind an address of TEST-NET-1, after the files are made).
    let o = run(0);
    assert!(state.join("tls/cert.pem").exists(), "{o:?}");
    let o = run(65534);
    let said = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{said}");
    assert!(
        said.contains("(state)") && said.contains("another user's") && said.contains("--state-dir"),
        "{said}"
    );
    assert!(!said.contains("server.cert"), "{said}");
}

/// An admin face given by `--admin` (or moved onto it by `--listen`) meets the rules one in
/// the file does: a socket in a folder anyone may write (anyone could rename it away and
/// answer the operator's `halt` themselves), and the webhooks' own port. It was taken as
/// given, unchecked.
#[test]
fn an_admin_face_from_a_flag_is_checked_as_one_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let open = open_folder(dir.path());
    let state = dir.path().join("state");
    let socket = format!("unix:{}", open.join("admin.sock").display());
    for (admin, listen, said) in [
        (socket.as_str(), "127.0.0.1:0", "writable by everyone"),
        ("127.0.0.1:1", "127.0.0.1:1", "takes webhooks"),
    ] {
        let o = output_within({
            let mut c = Command::new(BIN);
            c.args(["serve", "--state-dir", state.to_str().unwrap()])
                .args(["--listen", listen, "--admin", admin]);
            c
        });
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(78), "{admin}: {stderr}");
        assert!(
            stderr.contains("config error: --admin: ") && stderr.contains(said),
            "{admin}: {stderr}"
        );
    }
}

/// `--state-dir` is the embedded defaults' folder: beside `--config`, whose file names its
/// own paths, it would be ignored, so the pair is refused as a usage error.
#[test]
fn a_state_dir_beside_a_config_is_refused_not_ignored() {
    let o = cli(&[
        "serve",
        "--config",
        "/nonexistent/config.toml",
        "--state-dir",
        "/tmp/elsewhere",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains("--state-dir") && said.contains("--config"),
        "{said}"
    );
}

/// In an upgrade's window the new `hoox-edge` may talk to the old gateway, whose release
/// does not make this version's refusals (0.2.3 read no `--entry`): a release is sent only
/// where it is honoured as asked, and as asked: pinned to its entry, forced if told.
#[test]
fn a_release_is_not_sent_to_a_gateway_that_would_not_honour_it() {
    let ours = env!("CARGO_PKG_VERSION");
    let tag = "3.1764770000123.committed.ab12cd34";
    let args = ["keys", "release", "client:psk:live:k", "--entry", tag];
    let forced = [&args[..], &["--force"]].concat();
    let pinned = format!("POST /keys/client:psk:live:k/release?entry={tag} HTTP/1.1");
    let pinned_forced = pinned.replace(" HTTP", "&force=1 HTTP");
    for (version, args, sent) in [
        ("0.2.10", &args[..], Some(&pinned)),
        ("0.2.4", &forced[..], Some(&pinned_forced)),
        ("0.2.3", &args[..], None),
        ("0.1.0", &forced[..], None),
        (ours, &args[..], Some(&pinned)),
        (ours, &forced[..], Some(&pinned_forced)),
        ("99.0.0", &args[..], Some(&pinned)),
    ] {
        let (at, seen) = admin_of_version(version);
        let o = cli(&[args, &["--admin", &at]].concat());
        let said = String::from_utf8_lossy(&o.stderr);
        let seen = seen.lock().unwrap().clone();
        let released: Vec<_> = seen.iter().filter(|l| l.starts_with("POST ")).collect();
        assert_eq!(released, Vec::from_iter(sent), "{version} {args:?}: {said}");
        let sent = sent.is_some();
        assert_eq!(o.status.success(), sent, "{version}: {said}");
        if !sent {
            let why = format!("not sent: the gateway at {at} runs {version}, which ");
            assert!(said.contains(&why), "{said}");
        }
    }
}

/// Another service at the admin address, which answers 200 `{}` to everything: no
/// operator command takes that for hoox-edge's answer. `halt` printed its `{}` and exited
/// 0, and the operator believed trading halted.
#[test]
fn an_answer_that_is_not_hoox_edges_is_not_taken_for_one() {
    let (at, seen) = admin_of_version("0.2.13");
    for args in [
        &["halt"][..],
        &["resume"],
        &["keys", "list"],
        &["keys", "show", "client:psk:live:k"],
    ] {
        let o = cli(&[args, &["--admin", &at]].concat());
        let said = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(69), "{args:?}: {said}");
        assert!(o.stdout.is_empty(), "{args:?}");
        assert!(
            said.contains("not hoox-edge's admin API"),
            "{args:?}: {said}"
        );
    }
    assert_eq!(seen.lock().unwrap().len(), 4);
    // A release asks `/status` first, for the gateway's version: an answer without one is
    // not an old gateway's (every version's has said it), and nothing is released.
    let (at, seen) = admin_of_version("");
    let release = [
        "keys",
        "release",
        "client:psk:live:k",
        "--entry",
        "1.2.pending.0",
    ];
    let o = cli(&[&release[..], &["--admin", &at]].concat());
    let said = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(69), "{said}");
    assert!(said.contains("not hoox-edge's admin API"), "{said}");
    assert_eq!(*seen.lock().unwrap(), ["GET /status HTTP/1.1"]);
    // Nor a refusal that is not hoox-edge's (a 404 page): exit 1 would tell `keys show K`
    // there is no such key, and `halt` that it was refused for a reason of hoox-edge's.
    for status in ["404 Not Found", "501 Not Implemented"] {
        let (at, _) = admin_answering(status, "0.2.14");
        for args in [&["halt"][..], &["keys", "show", "client:psk:live:k"]] {
            let o = cli(&[args, &["--admin", &at]].concat());
            let said = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(69), "{status} {args:?}: {said}");
            assert!(said.contains("not hoox-edge's admin API"), "{said}");
        }
    }
}

/// A release names its entry as `keys show` gave it: none, or one pasted wrong (empty,
/// quoted from JSON, upper case), is a usage error (exit 2) and nothing is sent.
#[test]
fn a_release_without_an_entry_as_keys_show_gives_it_is_not_sent() {
    let (at, seen) = admin_of_version(env!("CARGO_PKG_VERSION"));
    let release = ["keys", "release", "client:psk:live:k"];
    for entry in [
        &[][..],
        &["--entry", ""],
        &["--entry", "\"3.1764770000123.pending.ab12cd34\""],
        &["--entry", "3.1764770000123.PENDING.AB12CD34"],
        &["--entry", &"1".repeat(65)],
    ] {
        let o = cli(&[&release[..], entry, &["--admin", &at]].concat());
        let said = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{entry:?}: {said}");
        assert!(said.contains("--entry"), "{entry:?}: {said}");
    }
    assert!(seen.lock().unwrap().is_empty());
}

/// A key too long for a URL (over 64 KiB once encoded; no key the gateway keeps is over
/// 384 bytes) is the command's bad input, exit 1, not an unreachable gateway (69), which a
/// script retries; nothing is sent.
#[test]
fn a_key_too_long_to_send_is_bad_input() {
    let (at, seen) = admin_of_version(env!("CARGO_PKG_VERSION"));
    let long = format!("client:psk:live:{}", " ".repeat(22_000));
    for args in [
        &["keys", "show", &long][..],
        &["keys", "release", &long, "--entry", "1.2.pending.0"],
    ] {
        let o = cli(&[args, &["--admin", &at]].concat());
        let said = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{said}");
        assert!(said.contains("too long"), "{said}");
    }
    let seen = seen.lock().unwrap();
    assert!(!seen.iter().any(|l| l.contains("/keys")), "{seen:?}");
}

/// An admin listener that hangs up without an answer is said to have done so, not taken
/// for one that is not HTTP (the webhook listener named by mistake): a reason that sends
/// the operator to the wrong config key.
#[test]
fn an_admin_listener_that_hangs_up_is_not_called_the_wrong_one() {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(tcp) = tcp else { return };
            let mut line = String::new();
            let _ = BufReader::new(&tcp).read_line(&mut line);
            drop(tcp);
        }
    });
    let o = cli(&["status", "--admin", &at]);
    let said = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(69), "{said}");
    assert!(
        said.contains("closed the connection without an answer"),
        "{said}"
    );
    assert!(!said.contains("plain HTTP"), "{said}");
}

/// A gateway that cannot answer (its database is held by another process, so it fails
/// closed) makes operator commands exit 69, as an unreachable one does: to a script both
/// mean "try again later", unlike a refusal (exit 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_command_the_gateway_cannot_answer_exits_69() {
    let holder_setup = Setup::new(None);
    let holder = holder_setup.start();
    holder.wait_ready().await;
    let (setup, _gw) = failing_closed_beside(&holder_setup).await;
    let config = setup.config_path();
    let o = cli(&[
        "keys",
        "show",
        "client:psk:live:x",
        "--config",
        config.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(69),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.stdout.is_empty());
    let err: Value = serde_json::from_slice(&o.stderr).unwrap();
    assert_eq!(err["code"], "IDEMPOTENCY_UNAVAILABLE");
    drop(holder);
}

/// `status` on a gateway that fails closed (its database is held by another process) still
/// prints its answer on stdout, which says why, but exits 69: a `status || alert` alerts on
/// a gateway that takes no trades. The same command on a serving gateway exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_exits_69_while_the_gateway_fails_closed() {
    let mut holder_setup = Setup::new(None);
    let holder_sock = holder_setup.dir.path().join("admin.sock");
    holder_setup.set("admin", "listen", format!("unix:{}", holder_sock.display()));
    let holder = holder_setup.start();
    holder.wait_ready().await;
    let holder_config = holder_setup.config_path();
    let serving = cli(&["status", "--config", holder_config.to_str().unwrap()]);
    assert_eq!(json_out(&serving)["serving"], true);

    let (setup, gw) = failing_closed_beside(&holder_setup).await;
    let config = setup.config_path();
    let o = cli(&["status", "--config", config.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(69), "{err}");
    let status: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(status["serving"], false, "{status}");
    let reason = status["fail_closed"].as_str().unwrap();
    assert!(!reason.is_empty(), "{status}");
    assert!(
        err.contains("takes no trades now: failing closed: "),
        "{err}"
    );
    drop(gw);
    drop(holder);
}

/// A key whose order is at the executor now is not released without `--force`: its
/// outcome is not known yet, and a retry let through could fill beside it. `keys show`
/// says which pending keys those are (`in_flight`); once the order settles, the key is the
/// operator's to release again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_order_is_out_is_released_only_by_force() {
    let exec = MockExecutor::start().await;
    // Each order stays out while two runs of the (debug) CLI ask about it: long enough for
    // them on a loaded machine, and well inside the executor's timeout.
    exec.set_mode(Mode::Slow(std::time::Duration::from_secs(5)));
    let mut setup = Setup::new(Some(&exec.url()));
    setup.set("executor", "timeout", "10s");
    let sock = setup.dir.path().join("admin.sock");
    setup.set("admin", "listen", format!("unix:{}", sock.display()));
    let gw = setup.start();
    gw.wait_ready().await;
    let config = setup.config_path();
    let admin = ["--config", config.to_str().unwrap()];
    let send = |key: &str| {
        let mut t = trade("BTCUSDT");
        t["idempotencyKey"] = json!(key);
        let (client, url) = (gw.client.clone(), gw.url());
        let auth = format!("Bearer {SECRET}");
        tokio::spawn(async move {
            let headers = [("authorization", auth.as_str())];
            client
                .request(hyper::Method::POST, &url, &headers, t.to_string())
                .await
        })
    };

    let first = send("out-1");
    exec.wait_for_calls(1).await;
    let key = "client:psk:live:out-1";
    let show = json_out(&cli(&[&["keys", "show", key][..], &admin].concat()));
    assert_eq!(
        (show["state"].as_str(), show["in_flight"].as_bool()),
        (Some("pending"), Some(true))
    );
    let pending_tag = show["entry"].as_str().unwrap().to_string();
    let release = ["keys", "release", key, "--entry", &pending_tag];
    let o = cli(&[&release[..], &admin].concat());
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("ORDER_IN_FLIGHT"));
    // `status` counts it: what an operator waits to see at 0 before a restart.
    let status = || json_out(&cli(&[&["status"][..], &admin].concat()))["orders_in_flight"].clone();
    assert_eq!(status(), 1);
    assert_eq!(first.await.unwrap().status, 200, "the order was cut off");
    assert_eq!(status(), 0);
    let show = json_out(&cli(&[&["keys", "show", key][..], &admin].concat()));
    assert_eq!(
        (show["state"].as_str(), show["in_flight"].as_bool()),
        (Some("committed"), Some(false))
    );
    // Force names the entry it overrides, as it was seen: this one was pending when looked
    // at, and has filled since.
    let o = cli(&[&["keys", "release", key, "--force"][..], &admin].concat());
    assert_eq!(
        o.status.code(),
        Some(2),
        "--force without --entry is a usage error"
    );
    let force = ["keys", "release", key, "--force", "--entry", &pending_tag];
    let o = cli(&[&force[..], &admin].concat());
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("KEY_CHANGED"));
    // Nor does the release the operator was told to wait with: they saw it out, and it
    // has filled since; freed, its retry would be placed again. Named by the entry as it
    // is now, it is freed.
    let o = cli(&[&release[..], &admin].concat());
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("KEY_CHANGED"));
    let committed_tag = show["entry"].as_str().unwrap();
    let rel = json_out(&cli(&[
        &["keys", "release", key, "--entry", committed_tag][..],
        &admin,
    ]
    .concat()));
    assert_eq!(
        (&rel["released"], &rel["in_flight"]),
        (&json!(true), &json!(false))
    );
    gw.wait_logged(&format!(
        "operator released key {key} (entry {committed_tag})"
    ));

    let second = send("out-2");
    exec.wait_for_calls(2).await;
    let key = "client:psk:live:out-2";
    let list = json_out(&cli(&[&["keys", "list"][..], &admin].concat()));
    assert_eq!(list["keys"][0]["in_flight"], true, "{list}");
    // Pinned to the entry looked at: another is not released, that one is.
    let entry = list["keys"][0]["entry"].as_str().unwrap();
    let force = |tag: &str| {
        cli(&[
            &["keys", "release", key, "--force", "--entry", tag][..],
            &admin,
        ]
        .concat())
    };
    let o = force("1.2.pending");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("KEY_CHANGED"));
    // Forced past an order that is out, the answer and the log say so: the one record
    // of a release that lets a retry be placed beside an order that may fill.
    let rel = json_out(&force(entry));
    assert_eq!(
        (&rel["released"], &rel["in_flight"]),
        (&json!(true), &json!(true))
    );
    gw.wait_logged(&format!(
        "operator released key {key} by force (entry {entry}) while its order was at the \
         executor"
    ));
    assert_eq!(second.await.unwrap().status, 200);
}

/// A held trade (its order ended in a 504) is not in flight, and is released without
/// force, while its sender retries it: each retry marks the key while its reserve is
/// asked, and those marks are not the held entry's. A signed order's signature guard is in
/// flight with its order, and not released without force either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_of_a_held_trade_leave_it_releasable_and_a_guard_is_out_with_its_order() {
    let (exec, _setup, gw) = with_mock_configured(|s| {
        s.set("executor", "timeout", "1s");
    })
    .await;
    exec.set_mode(Mode::Slow(std::time::Duration::from_secs(4)));
    let mut t = trade("BTCUSDT");
    t["idempotencyKey"] = json!("held-1");
    assert_eq!(gw.post(&t, &[]).await.status, 504);
    let show = "/keys/client:psk:live:held-1";

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let retries: Vec<_> = (0..4)
        .map(|_| {
            let (client, url, body, stop) =
                (gw.client.clone(), gw.url(), t.to_string(), stop.clone());
            tokio::spawn(async move {
                let mut conn = client.connect(&url).await.unwrap();
                let mut refused = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = conn.post(&url, &[], body.clone()).await.unwrap();
                    if r.status != 409 {
                        // Released: a retry goes through (a 504 again, a second later).
                        assert!(stop.load(std::sync::atomic::Ordering::Relaxed));
                        break;
                    }
                    refused += 1;
                }
                refused
            })
        })
        .collect();
    let mut tags = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let (s, v) = gw.admin("GET", show).await;
        assert_eq!((s, v["state"].as_str()), (200, Some("pending")), "{v}");
        assert_eq!(
            v["in_flight"], false,
            "a retry's mark read as the held order: {v}"
        );
        tags.insert(v["entry"].as_str().unwrap().to_string());
    }
    assert_eq!(tags.len(), 1, "one entry, one tag: {tags:?}");
    let tag = tags.first().unwrap();
    // Retries still coming: they stop, and may go through, once it is released.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (s, v) = gw
        .admin("POST", &format!("{show}/release?entry={tag}"))
        .await;
    assert_eq!((s, v["released"].as_bool()), (200, Some(true)), "{v}");
    let mut refused = 0;
    for r in retries {
        refused += r.await.unwrap();
    }
    assert!(
        refused >= 40,
        "only {refused} retries while the operator looked"
    );

    // A signed order at the executor: its guard is out with it.
    let (exec, _setup, gw) = with_mock_configured(|s| {
        s.set("executor", "timeout", "10s");
    })
    .await;
    exec.set_mode(Mode::Slow(std::time::Duration::from_secs(5)));
    let calls = exec.calls();
    let mut t = trade("ETHUSDT");
    t.as_object_mut().unwrap().remove("apiKey");
    let body = t.to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let sig = hoox_edge::gateway::auth::sign(SECRET.as_bytes(), now, body.as_bytes());
    let (client, url) = (gw.client.clone(), gw.url());
    let order = tokio::spawn(async move {
        let ts = now.to_string();
        let headers = [
            ("x-hoox-timestamp", ts.as_str()),
            ("x-hoox-signature", sig.as_str()),
        ];
        client
            .request(hyper::Method::POST, &url, &headers, body)
            .await
    });
    exec.wait_for_calls(calls + 1).await;
    let (_, list) = gw.admin("GET", "/keys").await;
    let keys = list["keys"].as_array().unwrap();
    let guard = keys
        .iter()
        .find(|k| k["key"].as_str().unwrap().starts_with("sig:"))
        .unwrap_or_else(|| panic!("no guard: {list}"));
    assert_eq!(guard["in_flight"], true, "{list}");
    let (s, v) = gw
        .admin(
            "POST",
            &format!(
                "/keys/{}/release?entry={}",
                guard["key"].as_str().unwrap(),
                guard["entry"].as_str().unwrap()
            ),
        )
        .await;
    assert_eq!(
        (s, v["code"].as_str()),
        (409, Some("ORDER_IN_FLIGHT")),
        "{v}"
    );
    assert_eq!(order.await.unwrap().status, 200);
    let (_, list) = gw.admin("GET", "/keys").await;
    assert!(
        list["keys"]
            .as_array()
            .unwrap()
            .iter()
            .all(|k| k["in_flight"] == false),
        "{list}"
    );
}

/// Without `[admin]` the gateway serves webhooks and no admin API, and says so: on stdout
/// ("admin off") and as a warning, since the kill switch and `/readyz` go with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_section_the_gateway_serves_and_warns() {
    let mut setup = Setup::new(None);
    setup.config.remove("admin");
    let mut gw = setup.start();
    assert!(gw.admin.is_none(), "it did not print \"admin off\"");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        // 503 until the database is open: there is no /readyz to ask.
        match gw.post(&trade("BTCUSDT"), &[]).await.status.as_u16() {
            503 if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            status => break assert_eq!(status, 200),
        }
    }
    assert!(gw.terminate().success());
    let log = gw.stderr();
    assert!(
        log.contains("WARN  hoox_edge::app: no [admin] listen"),
        "{log}"
    );
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
    let sign = |extra: &[&str]| {
        let files = [
            "sign",
            "--secret-file",
            secret_file.to_str().unwrap(),
            "--body-file",
            body_file.to_str().unwrap(),
        ];
        cli(&[&files[..], extra].concat())
    };
    let before = unix_s();
    let o = sign(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8(o.stdout).unwrap();
    let err = String::from_utf8(o.stderr).unwrap();
    // No secret of the file (old or new) ever appears in the output or the log.
    let text = std::fs::read_to_string(&secret_file).unwrap();
    let secrets: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(secrets, ["old-secret-xyz", SECRET]);
    for s in &secrets {
        assert!(!out.contains(s), "stdout holds a secret: {out}");
        assert!(!err.contains(s), "stderr holds a secret: {err}");
    }
    let headers: Vec<(String, String)> = out
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(": ").unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    assert_eq!(headers.len(), 2);
    assert_eq!(headers[0].0, "X-Hoox-Timestamp");
    assert_eq!(headers[1].0, "X-Hoox-Signature");
    // The signature is HMAC-SHA256 over "{timestamp}.{body}" with the file's FIRST secret,
    // computed here independently of the crate.
    let ts: i64 = headers[0].1.parse().unwrap();
    assert!(
        (before..=unix_s()).contains(&ts),
        "timestamp {ts} is not the time of signing ({before}..)"
    );
    let mac = |secret: &str| {
        use hmac::{KeyInit, Mac};
        let mut m =
            <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).unwrap();
        m.update(format!("{ts}.{body}").as_bytes());
        format!("sha256={}", hex::encode(m.finalize().into_bytes()))
    };
    assert_eq!(
        headers[1].1,
        mac(secrets[0]),
        "not signed with the first secret"
    );
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
    // A timestamp in milliseconds is refused: the gateway reads seconds.
    let o = sign(&["--timestamp", "1764900000000"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty());
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
    // A name no client could ask for is refused, and nothing is written.
    let elsewhere = dir.path().join("url");
    let o = cli(&[
        "gen-cert",
        "--out",
        elsewhere.to_str().unwrap(),
        "--name",
        "https://gw.lan",
    ]);
    assert!(!o.status.success());
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains("\"https://gw.lan\" is not a DNS name"),
        "{said}"
    );
    assert!(!elsewhere.join("cert.pem").exists() && !elsewhere.join("key.pem").exists());
    // A second run does not overwrite without --force, nor a key alone (its certificate
    // may be on its way from a CA).
    let o = cli(&["gen-cert", "--out", out.to_str().unwrap()]);
    assert!(!o.status.success());
    std::fs::remove_file(out.join("cert.pem")).unwrap();
    let key = std::fs::read(out.join("key.pem")).unwrap();
    let o = cli(&["gen-cert", "--out", out.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("key.pem exists"));
    assert_eq!(std::fs::read(out.join("key.pem")).unwrap(), key);
    // --force replaces both, and a key left readable by others does not stay so.
    let open = std::fs::Permissions::from_mode(0o644);
    std::fs::set_permissions(out.join("key.pem"), open).unwrap();
    let o = cli(&["gen-cert", "--out", out.to_str().unwrap(), "--force"]);
    assert!(o.status.success());
    assert_ne!(std::fs::read(out.join("key.pem")).unwrap(), key);
    let mode = std::fs::metadata(out.join("key.pem"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the new key.pem is {mode:o}");
    assert!(files.load().is_ok());
}

/// What a printed `curl` line asks for: `--cacert FILE`, `-H @FILE` (headers read from a
/// file), `-H 'Name: value'`, `-d 'BODY'`, and the URL. Words split as a shell would, for the
/// single quotes the gateway prints.
#[derive(Debug, Default)]
struct CurlLine {
    cacert: String,
    header_files: Vec<String>,
    headers: Vec<(String, String)>,
    body: String,
    url: String,
}

fn parse_curl(line: &str) -> CurlLine {
    let mut words = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut in_word) = (false, false);
    for c in line.trim().chars() {
        match c {
            '\'' => (quoted, in_word) = (!quoted, true),
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                }
                in_word = false;
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    assert!(!quoted, "unbalanced quote in {line:?}");
    if in_word {
        words.push(word);
    }
    assert_eq!(words.first().map(String::as_str), Some("curl"), "{line:?}");
    let mut out = CurlLine::default();
    let mut it = words.into_iter().skip(1);
    while let Some(w) = it.next() {
        let mut arg = || it.next().unwrap_or_else(|| panic!("{w} without a value"));
        match w.as_str() {
            "--cacert" => out.cacert = arg(),
            "-H" => {
                let h = arg();
                match h.strip_prefix('@') {
                    Some(file) => out.header_files.push(file.to_string()),
                    None => out.headers.push(header_line(&h)),
                }
            }
            "-d" | "--data" | "--data-binary" => out.body = arg(),
            u if u.starts_with("https://") => out.url = u.to_string(),
            other => panic!("unexpected curl argument {other:?} in {line:?}"),
        }
    }
    out
}

fn header_line(h: &str) -> (String, String) {
    let (k, v) = h
        .split_once(':')
        .unwrap_or_else(|| panic!("not a header: {h:?}"));
    (k.trim().to_string(), v.trim().to_string())
}

/// The next stdout line of a gateway that contains `needle`, within 20 s.
fn next_line_with(rx: &std::sync::mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(needle) => return l,
            Ok(l) => seen.push(l),
            Err(e) => panic!("no line with {needle:?} ({e}); stdout after the first: {seen:?}"),
        }
    }
}

/// One start of `serve` on the embedded defaults: the gateway, ready, and its curl line.
async fn serve_embedded(state: &std::path::Path) -> (Gateway, CurlLine, String) {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--state-dir",
    ])
    .arg(state)
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .env_remove("NOTIFY_SOCKET")
    .env_remove("WATCHDOG_USEC");
    // The certificate is written before the listener binds, so it exists once the first
    // line is out; the gateway's own client trusts it (the test's requests use the one the
    // curl line names).
    let (gw, rx) = Gateway::spawn_with_stdout(cmd, &state.join("tls/cert.pem"));
    let line = next_line_with(&rx, "curl ");
    gw.wait_ready().await;
    (gw, parse_curl(&line), line)
}

/// The headers a parsed curl line sends: its files' lines and its own `-H`s.
fn curl_headers(curl: &CurlLine) -> Vec<(String, String)> {
    let mut headers = Vec::new();
    for f in &curl.header_files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{f}: {e}"));
        headers.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(header_line),
        );
    }
    headers.extend(curl.headers.iter().cloned());
    headers
}

async fn send_curl(client: &TlsClient, curl: &CurlLine, headers: &[(String, String)]) -> Reply {
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    client
        .request(hyper::Method::POST, &curl.url, &h, curl.body.clone())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_defaults_check_and_print_a_working_curl_line() {
    // `serve` with no config on a free port: the first run creates its state and prints the
    // line to try; that line, sent as curl would send it, is a trade, and its resend a
    // duplicate.
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (mut gw, curl, line) = serve_embedded(&state).await;
    let real_state = std::fs::canonicalize(&state).unwrap();
    assert_eq!(
        std::path::Path::new(&curl.cacert),
        real_state.join("tls/cert.pem"),
        "{line}"
    );
    assert_eq!(
        curl.header_files,
        [real_state
            .join("secrets/curl-auth.header")
            .display()
            .to_string()],
        "{line}"
    );
    assert_eq!(
        curl.url,
        format!("https://{}/webhook", gw.addr),
        "the curl line's URL is not where the gateway listens"
    );
    let secret = std::fs::read_to_string(state.join("secrets/secret")).unwrap();
    assert_eq!(secret.trim().len(), 64);
    // The secret stays in its file, never in the printed command line.
    assert!(!line.contains(secret.trim()), "{line}");
    let headers = curl_headers(&curl);
    assert!(
        headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("authorization") && v.contains(secret.trim())),
        "the header file does not carry the secret: {headers:?}"
    );

    // Over real TLS, trusting only the certificate the line names.
    let client = TlsClient::new(std::path::Path::new(&curl.cacert));
    let r = send_curl(&client, &curl, &headers).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let r = send_curl(&client, &curl, &headers).await;
    assert_eq!(r.status, 409, "{:?}", r.json());
    assert_eq!(r.json()["code"], "DUPLICATE");

    // Stopped (SIGTERM to its PID) and started again on the same state: nothing is
    // regenerated, the same line still authenticates, and the trade's key survived.
    let files = [
        "tls/cert.pem",
        "tls/key.pem",
        "secrets/secret",
        "secrets/curl-auth.header",
    ];
    let before: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(state.join(f)).unwrap())
        .collect();
    assert!(gw.terminate().success(), "{}", gw.stderr());
    drop(gw);
    let (gw2, curl2, line2) = serve_embedded(&state).await;
    for (f, was) in files.iter().zip(&before) {
        assert!(
            std::fs::read(state.join(f)).unwrap() == *was,
            "{f} changed on the second start"
        );
    }
    assert_eq!(curl2.cacert, curl.cacert, "{line2}");
    assert_eq!(curl2.header_files, curl.header_files, "{line2}");
    assert_eq!(curl2.body, curl.body, "{line2}");
    assert_eq!(curl2.url, format!("https://{}/webhook", gw2.addr));
    // The first run's client (its trust loaded from the first certificate) and headers, at
    // the second run's address.
    let r = send_curl(&client, &curl2, &headers).await;
    assert_eq!(r.status, 409, "{:?}", r.json());
    assert_eq!(r.json()["code"], "DUPLICATE");
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
        // tokio names its blocking pool's threads as its workers: one is kept (`cli::runtime`).
        assert_eq!(
            threads_named(pid, "tokio-rt-worker"),
            workers + 1,
            "{cores} cores, TOKIO_WORKER_THREADS={env:?}"
        );
        drop(gw);
    }
}

/// `check-config` on `config`: the exit code and stderr.
/// /dev/full, opened for writing: every write fails with ENOSPC, as on a full disk.
fn dev_full() -> std::fs::File {
    std::fs::File::options()
        .write(true)
        .open("/dev/full")
        .unwrap()
}

/// A stdout on a full disk: a command whose answer is what it prints exits 74 (EX_IOERR) and
/// says why, not a panic's abort; `serve` says so and serves all the same (its stdout is
/// only for people), so a gateway whose output file fills comes up and fails closed as it
/// should, where it died at every start before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_that_cannot_be_written_stops_a_command_not_the_gateway() {
    let mut setup = Setup::new(None);
    let sock = setup.dir.path().join("admin.sock");
    setup.set("admin", "listen", format!("unix:{}", sock.display()));
    let config = setup.write_config();
    let full = "cannot write to stdout: No space left on device";
    for args in [
        &["check-config", "--config"][..],
        &["gen-cert", "--out"][..],
    ] {
        let target = match args[0] {
            "gen-cert" => setup.dir.path().join("tls-new"),
            _ => config.clone(),
        };
        let o = Command::new(BIN)
            .args(args)
            .arg(&target)
            .stdout(dev_full())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(74), "{args:?}: {stderr}");
        assert!(stderr.contains(full), "{args:?}: {stderr}");
    }
    // clap's own answers too; a usage error, on stderr, keeps its 2.
    for (args, code) in [
        (&["--help"][..], 74),
        (&["--version"], 74),
        (&["nonsense"], 2),
    ] {
        let o = Command::new(BIN)
            .args(args)
            .stdout(dev_full())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {stderr}");
        assert_eq!(code == 74, stderr.contains(full), "{args:?}: {stderr}");
    }

    // Past a file-size limit (stdout appended to a file already over it): EFBIG, not the
    // SIGXFSZ that killed the command, with no word and no exit code of its own.
    let over = setup.dir.path().join("over-the-limit.log");
    std::fs::write(&over, "a line before\n").unwrap();
    let appended = std::fs::File::options().append(true).open(&over).unwrap();
    let mut limited = Command::new(BIN);
    limited.args(["check-config", "--config"]).arg(&config);
    limited.stdout(appended);
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut limited, || {
            let l = libc::rlimit {
                rlim_cur: 1,
                rlim_max: libc::RLIM_INFINITY,
            };
            match libc::setrlimit(libc::RLIMIT_FSIZE, &l) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    let o = limited.output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(74), "{:?}: {stderr}", o.status);
    assert!(
        stderr.contains("cannot write to stdout: File too large"),
        "{stderr}"
    );

    let mut cmd = setup.command();
    cmd.stdout(dev_full());
    let admin = hoox_edge::admin::Listen::parse(&format!("unix:{}", sock.display())).unwrap();
    let mut gw = Gateway::spawn_reading_the_log(cmd, &setup.pki.ca_cert, admin);
    gw.wait_ready().await;
    assert_eq!(gw.post(&trade("BTCUSDT"), &[]).await.status, 200);
    assert!(gw.stderr().contains(full), "{}", gw.stderr());
    let admin = ["--config", config.to_str().unwrap()];
    let o = Command::new(BIN)
        .args([&["status"][..], &admin].concat())
        .stdout(dev_full())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(74));
    assert!(gw.terminate().success());
}

fn check_config(config: &std::path::Path) -> (Option<i32>, String) {
    let o = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(config)
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A secrets file saved as UTF-16 (PowerShell 5's `>`) is a config error naming the key,
/// the file and the encoding, from `check-config` and from `serve`: read as bytes it held
/// one secret of a NUL, which any request could send, and not the one written in it.
#[test]
fn a_secrets_file_saved_as_utf16_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let setup = Setup::new(None);
    let file = setup.dir.path().join("secrets/api-keys");
    let mut utf16 = vec![0xff, 0xfe];
    utf16.extend(
        "my-real-secret\r\n"
            .encode_utf16()
            .flat_map(u16::to_le_bytes),
    );
    std::fs::write(&file, utf16).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = setup.write_config();
    let (code, err) = check_config(&config);
    assert_eq!(code, Some(78), "{err}");
    for said in ["auth.api_keys_file", "secrets/api-keys", "line 1", "UTF-16"] {
        assert!(err.contains(said), "{said}: {err}");
    }
    let o = setup.command().output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(err.contains("UTF-16"), "{err}");
}

/// A secret that one file gives a client of its own and another file gives another (here
/// the bearer file names it `@desk-a`, the API keys' file not) is refused at check-config
/// and at start, naming the file's key, both files and both clients, never the secret: a
/// sender retrying by the other method would be another client, its trade placed again.
#[test]
fn a_secret_given_two_clients_in_two_files_is_refused() {
    let setup = Setup::new(None);
    let secret = support::gateway::SECRET;
    let bearer = setup.dir.path().join("secrets/bearer");
    support::gateway::write_secret(&bearer, &format!("@desk-a {secret}\n"));
    let config = setup.write_config();
    let (code, err) = check_config(&config);
    assert_eq!(code, Some(78), "{err}");
    let said = "auth.bearer_tokens_file: a secret of auth.api_keys_file is also in \
                auth.bearer_tokens_file, for another client (psk there, psk.desk-a here)";
    assert!(err.contains(said), "{err}");
    assert!(err.contains(&config.display().to_string()), "{err}");
    let o = setup.command().output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains(said), "{stderr}");
    for out in [&err, &stderr.to_string()] {
        assert!(!out.contains(secret), "{out}");
    }
    // The same client in every file: taken.
    for f in ["api-keys", "hmac"] {
        let file = setup.dir.path().join("secrets").join(f);
        support::gateway::write_secret(&file, &format!("@desk-a {secret}\n"));
    }
    let (code, err) = check_config(&config);
    assert_eq!(code, Some(0), "{err}");
}

/// A `store.path` whose folder is not there passes (the gateway starts and fails closed
/// until a late mount comes up), with a warning: a typo said ok refused every trade.
#[test]
fn check_config_warns_of_a_store_folder_not_there() {
    let mut setup = Setup::new(None);
    let warning = "store.path: the folder";
    for (path, warned) in [
        ("state/mutex.redb", false),
        ("mutex.redb", false),
        ("stat/mutex.redb", true),
    ] {
        setup.set("store", "path", path);
        let (code, err) = check_config(&setup.write_config());
        assert_eq!(code, Some(0), "{path}: {err}");
        assert_eq!(err.contains(warning), warned, "{path}: {err}");
    }
    // Named by its file name alone, from its own folder: the folder not there is named
    // whole, where an operator in another folder finds it (it was `stat`).
    let config = setup.write_config();
    let dir = config.parent().unwrap();
    let o = Command::new(BIN)
        .current_dir(dir)
        .args(["check-config", "--config"])
        .arg(config.file_name().unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let whole = format!("the folder {} is not there", dir.join("stat").display());
    assert!(err.contains(&whole), "{err}");
}

/// An admin socket whose folder is not there passes, with a warning: `serve` then cannot
/// listen there and stops at its start. Not for the unit's `RuntimeDirectory=`, which
/// systemd makes at each start, after a first install's check.
#[test]
fn check_config_warns_of_an_admin_socket_folder_not_there() {
    let mut setup = Setup::new(None);
    let warning = "admin.listen: the folder";
    setup.set("admin", "listen", "unix:run/admin.sock");
    let config = setup.write_config();
    let (code, err) = check_config(&config);
    assert_eq!(code, Some(0), "{err}");
    let run = config.parent().unwrap().join("run");
    let whole = format!("{warning} {} is not there (yet)", run.display());
    assert!(err.contains(&whole), "{err}");
    std::fs::create_dir(&run).unwrap();
    let (code, err) = check_config(&config);
    assert_eq!((code, err.contains(warning)), (Some(0), false), "{err}");
    if !Path::new("/run/hoox-edge").exists() {
        setup.set("admin", "listen", "unix:/run/hoox-edge/admin.sock");
        let (code, err) = check_config(&setup.write_config());
        assert_eq!((code, err.contains(warning)), (Some(0), false), "{err}");
    }
}

/// A listen address on port 0 passes (tests run so), with a warning: no sender could find
/// the webhook's, nor an operator command (`halt`) the admin face's.
#[test]
fn check_config_warns_of_a_port_the_os_picks() {
    let mut setup = Setup::new(None);
    let (code, err) = check_config(&setup.write_config());
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("server.listen: port 0") && err.contains("admin.listen: port 0"),
        "{err}"
    );
    setup
        .set("server", "listen", "127.0.0.1:18999")
        .set("admin", "listen", "127.0.0.1:18998");
    let (code, err) = check_config(&setup.write_config());
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("port 0"), "{err}");
}

/// A config without `[admin]` passes (an operator may want no admin face), and is warned
/// of, as `serve` warns: before a deploy finds no /readyz, key release or kill switch.
/// Its "ok" names the executor, as `serve` does at start. A config without `[executor]`
/// is refused, naming `executor.kind` (it ran paper: 200s, and no order placed).
#[test]
fn check_config_warns_of_a_config_without_admin() {
    let mut setup = Setup::new(None);
    let (code, err) = check_config(&setup.write_config());
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("[admin]"), "{err}");
    let said = |setup: &Setup| {
        let o = Command::new(BIN)
            .args(["check-config", "--config"])
            .arg(setup.config_path())
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    setup.set("executor", "kind", "http");
    setup.set("executor", "url", "http://127.0.0.1:9/orders");
    setup.write_config();
    let out = said(&setup);
    assert!(
        out.ends_with(": ok (executor: http: orders go to http://127.0.0.1:9/…)\n"),
        "{out}"
    );
    setup.config.remove("executor");
    let (code, err) = check_config(&setup.write_config());
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("executor.kind: required"), "{err}");
    setup.set("executor", "kind", "paper");
    setup.write_config();
    let out = said(&setup);
    assert!(
        out.contains("ok (executor: paper: fills are simulated"),
        "{out}"
    );
    setup
        .config
        .remove("admin")
        .expect("the rig's config has [admin]");
    let (code, err) = check_config(&setup.write_config());
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("warning: no [admin] listen"), "{err}");
}

/// `on_unknown_outcome = "release"` passes, and is warned of, naming the file: it lets a
/// retry of a timed-out order through. The default (hold) is not.
#[test]
fn check_config_warns_of_releasing_an_unknown_outcome() {
    let mut setup = Setup::new(None);
    setup.set("executor", "on_unknown_outcome", "hold");
    let (code, err) = check_config(&setup.write_config());
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("on_unknown_outcome"), "{err}");
    setup.set("executor", "on_unknown_outcome", "release");
    let path = setup.write_config();
    let (code, err) = check_config(&path);
    assert_eq!(code, Some(0), "{err}");
    let want = format!(
        "warning: {}: executor.on_unknown_outcome = \"release\": an order whose outcome is \
         unknown (504) is released, and a retry of it may be placed twice",
        path.display()
    );
    assert!(err.contains(&want), "{err}");
}

#[test]
fn a_missing_file_is_a_config_error_naming_the_key_and_the_path() {
    // The rig's own config passes: what fails below is the one missing file.
    let mut setup = Setup::new(None);
    let (code, err) = check_config(&setup.write_config());
    assert_eq!(code, Some(0), "{err}");
    let config = setup.config_path();
    for (section, key) in [
        ("auth", "api_keys_file"),
        ("auth", "hmac_secrets_file"),
        ("auth", "bearer_tokens_file"),
        ("server", "cert"),
        ("server", "key"),
        ("server", "client_ca"),
    ] {
        let saved = setup.config[section].get(key).cloned();
        let missing = setup.dir.path().join(format!("missing/{key}.pem"));
        setup.set(section, key, missing.display().to_string());
        let (code, err) = check_config(&setup.write_config());
        assert_eq!(code, Some(78), "{section}.{key}: {err}");
        assert!(
            err.contains(&format!("{section}.{key}")),
            "{section}.{key} not named: {err}"
        );
        assert!(
            err.contains(&missing.display().to_string()),
            "{} not named: {err}",
            missing.display()
        );
        match saved {
            Some(v) => setup.set(section, key, v),
            None => setup.remove(section, key),
        };
    }
    assert_eq!(check_config(&setup.write_config()).0, Some(0));

    // No config file at all: said so, naming the file.
    std::fs::remove_file(&config).unwrap();
    let (code, err) = check_config(&config);
    assert_eq!(code, Some(78), "{err}");
    assert!(
        err.contains(&config.display().to_string()) && err.contains("cannot read"),
        "{err}"
    );
}

/// A log level that names none is said, once, and the command still does its work at info.
#[test]
fn an_unknown_log_level_is_said_and_read_as_info() {
    let setup = Setup::new(None);
    let config = setup.write_config();
    for (value, said) in [("loud", true), ("warn", false)] {
        let o = Command::new(BIN)
            .args(["check-config", "--config"])
            .arg(&config)
            .env("HOOX_EDGE_LOG", value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{value}: {err}");
        let warned = format!("WARN  hoox_edge::cli: HOOX_EDGE_LOG={value:?}: not one of");
        assert_eq!(err.matches(&warned).count(), usize::from(said), "{err}");
    }
}

/// Runs `cmd` to its end, for at most 30 s (killed then, and the test fails): the output.
fn output_within(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} still running after 30 s; stderr:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `TOKIO_WORKER_THREADS` that is not a number of threads (`auto` in a systemd drop-in, or
/// 0) is a config error naming it, exit 78, from `serve` and from the operator commands
/// that build a runtime too; not tokio's panic, which a release build turns into SIGABRT
/// and systemd into a restart loop.
#[test]
fn a_bad_worker_thread_count_is_a_config_error() {
    let setup = Setup::new(None);
    let status = |value: &str| {
        let mut cmd = Command::new(BIN);
        cmd.args(["status", "--admin", "127.0.0.1:1"])
            .env("TOKIO_WORKER_THREADS", value);
        output_within(cmd)
    };
    for value in ["0", "auto"] {
        let mut serve = setup.command();
        serve.env("TOKIO_WORKER_THREADS", value);
        for (what, o) in [("serve", output_within(serve)), ("status", status(value))] {
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(78), "{what}, {value}: {err}");
            assert!(
                err.contains(&format!("TOKIO_WORKER_THREADS={value:?}")),
                "{what}, {value}: {err}"
            );
        }
    }
    // A number is taken: the runtime starts, and the command gets as far as finding that
    // nobody listens there.
    let o = status("2");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(69), "{err}");
    assert!(!err.contains("TOKIO_WORKER_THREADS"), "{err}");
}

/// `check-config` refuses the `TOKIO_WORKER_THREADS` that `serve` refuses (exit 78, naming
/// it), and takes the ones `serve` takes: a reload's or an upgrade's check that passed a
/// value the start then refuses would leave the service down (systemd does not restart an
/// exit 78).
#[test]
fn check_config_refuses_the_worker_thread_counts_serve_refuses() {
    let setup = Setup::new(None);
    let config = setup.write_config();
    let check = |value: &str| {
        let mut cmd = Command::new(BIN);
        cmd.args(["check-config", "--config"])
            .arg(&config)
            .env("TOKIO_WORKER_THREADS", value);
        output_within(cmd)
    };
    for value in ["0", "auto", "1025", " "] {
        let o = check(value);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(78), "{value:?}: {err}");
        assert!(
            err.contains(&format!("config error: TOKIO_WORKER_THREADS={value:?}")),
            "{value:?}: {err}"
        );
        // serve, the same value, the same refusal.
        let mut serve = setup.command();
        serve.env("TOKIO_WORKER_THREADS", value);
        let o = output_within(serve);
        assert_eq!(o.status.code(), Some(78), "serve, {value:?}");
    }
    for value in ["1", "1024"] {
        let o = check(value);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{value:?}: {err}");
    }
    // A bad config and a bad value: both said, in one run.
    let mut broken = Setup::new(None);
    broken.set("store", "ttl", "forever");
    let o = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(broken.write_config())
        .env("TOKIO_WORKER_THREADS", "0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(
        err.contains("store.ttl") && err.contains("TOKIO_WORKER_THREADS=\"0\""),
        "{err}"
    );
}

/// A secrets file anyone may write (0602) is a config error naming the key and the file:
/// any user of the machine could otherwise add a secret of their own.
#[test]
fn a_world_writable_secrets_file_is_a_config_error() {
    use std::os::unix::fs::PermissionsExt;
    let setup = Setup::new(None);
    let config = setup.write_config();
    let hmac = setup.dir.path().join("secrets/hmac");
    std::fs::set_permissions(&hmac, std::fs::Permissions::from_mode(0o602)).unwrap();
    let (code, err) = check_config(&config);
    assert_eq!(code, Some(78), "{err}");
    assert!(
        err.contains("auth.hmac_secrets_file")
            && err.contains(&hmac.display().to_string())
            && err.contains("writable by everyone"),
        "{err}"
    );
    std::fs::set_permissions(&hmac, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(check_config(&config).0, Some(0));
}

/// The soft and hard "Max open files" of a running process (`/proc/PID/limits`).
fn open_file_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no open-file limit in {limits}"));
    let n: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1])
}

/// Started with a soft open-file limit of 256 (a shell's `ulimit -n`), `serve` takes its
/// hard limit, and says so; and if `server.max_connections` still does not fit under it,
/// it warns, naming the setting and the remedy, and serves anyway.
#[test]
fn serve_raises_its_open_file_limit_to_the_hard_limit() {
    use std::os::unix::process::CommandExt;
    let mut ours = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut ours) },
        0
    );
    // No higher than ours: only root may raise a hard limit.
    let hard = ours.rlim_max.min(4096);
    assert!(
        hard > 512,
        "this test needs a hard open-file limit above 512"
    );
    let mut setup = Setup::new(None);
    // Few enough connections to fit under any hard limit the test runs with.
    setup.set("server", "max_connections", 64);
    let start = |setup: &Setup| {
        let mut cmd = setup.command();
        let lim = libc::rlimit {
            rlim_cur: 256,
            rlim_max: hard,
        };
        // SAFETY: between fork and exec only setrlimit runs, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        Gateway::spawn(cmd, &setup.pki.ca_cert)
    };

    let gw = start(&setup);
    // Raised before it binds: once it listens, the limit is the one it took.
    let log = gw.wait_logged("listening on https://");
    assert_eq!(open_file_limits(gw.child.id()), (hard, hard));
    assert!(
        log.contains(&format!(
            "INFO  hoox_edge::cli: open-file limit (RLIMIT_NOFILE) raised from 256 to {hard}"
        )),
        "{log}"
    );
    assert!(!log.contains("server.max_connections"), "{log}");
    drop(gw); // killed, by its PID, and waited for

    // More connections than the hard limit allows: said, and served anyway.
    setup.set("server", "max_connections", hard as i64);
    let gw = start(&setup);
    let log = gw.wait_logged("listening on https://");
    let warning = log
        .lines()
        .find(|l| l.contains("WARN  hoox_edge::cli: server.max_connections = "))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    for said in [
        format!("over the open-file limit of {hard}"),
        "LimitNOFILE=".to_string(),
        "ulimit -n".to_string(),
    ] {
        assert!(warning.contains(&said), "{said:?} not in {warning}");
    }
    drop(gw);

    // Half as many fit, unless each order out holds an HTTP executor connection too.
    let half = hard as i64 / 2;
    setup.set("server", "max_connections", half);
    let gw = start(&setup);
    let log = gw.wait_logged("listening on https://");
    assert!(
        !log.contains("WARN  hoox_edge::cli: server.max_connections"),
        "{log}"
    );
    drop(gw);
    setup.set("executor", "kind", "http");
    setup.set("executor", "url", "http://127.0.0.1:9/orders");
    let gw = start(&setup);
    let log = gw.wait_logged("listening on https://");
    assert!(
        log.contains(&format!(
            "server.max_connections = {half} needs about {} open files (the connections, \
             as many again for the HTTP executor's,",
            2 * half + 64
        )),
        "{log}"
    );
    drop(gw);
}

/// Requests refused before they authenticate are anyone's to send: at the default level
/// they make no line each, only a warning a minute that counts them (here the first, which
/// comes at once), while an authenticated request still has its line, the audit trail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_refusals_are_summarised_not_logged_each() {
    let setup = Setup::new(None);
    let gw = setup.start();
    gw.wait_ready().await;
    let mut wrong = trade("BTCUSDT");
    wrong["apiKey"] = json!("wrong-key-4d1e");
    for _ in 0..3 {
        assert_eq!(gw.post(&wrong, &[]).await.status, 401);
    }
    let elsewhere = format!("https://localhost:{}/elsewhere", gw.addr.port());
    let r = gw
        .client
        .request(hyper::Method::POST, &elsewhere, &[], "{}")
        .await;
    assert_eq!(r.status, 404);
    let r = gw.post(&trade("BTCUSDT"), &[]).await;
    assert_eq!(r.status, 200);
    // Its line is written before its answer, so it is there once the reader has it.
    let log = gw.wait_logged(": webhook status=200 ");
    assert_eq!(
        log.matches(" INFO  hoox_edge::gateway::webhook: webhook status=200 ")
            .count(),
        1,
        "{log}"
    );
    for refused in ["status=401", "status=404", "auth refused"] {
        assert!(!log.contains(refused), "{refused}:\n{log}");
    }
    let summaries: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN  hoox_edge::gateway::webhook: refused "))
        .collect();
    assert_eq!(summaries.len(), 1, "{log}");
    assert!(
        summaries[0].contains("refused 1 unauthenticated request(s) since the start: 401"),
        "{log}"
    );
}

/// A served certificate out of its dates is served (a client that skips them still
/// works) but said: by `check-config`, by `serve` at start and at each reload, and as the
/// metric `hoox_tls_certificate_expiry_timestamp_seconds`, which a reload to a good
/// certificate moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_said_and_its_end_is_a_metric() {
    let setup = Setup::new(None);
    let cert = &setup.pki.server;
    let good = (
        std::fs::read(&cert.cert).unwrap(),
        std::fs::read(&cert.key).unwrap(),
    );
    let not_after = |pem: &[u8]| {
        use rustls::pki_types::pem::PemObject;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem).unwrap();
        let (_, c) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
        c.validity().not_after.timestamp()
    };
    let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let key = rcgen::KeyPair::generate().unwrap();
    let expired = params.self_signed(&key).unwrap().pem();
    let write = |c: &[u8], k: &[u8]| {
        std::fs::write(&cert.cert, c).unwrap();
        std::fs::write(&cert.key, k).unwrap();
    };
    write(expired.as_bytes(), key.serialize_pem().as_bytes());

    let (code, err) = check_config(&setup.write_config());
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("the certificate expired on Fri, 01 Jan 2021"),
        "{err}"
    );

    let gw = setup.start();
    gw.wait_ready().await;
    gw.wait_logged("the certificate expired on Fri, 01 Jan 2021");
    let metric = |text: serde_json::Value| {
        text.as_str()
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("hoox_tls_certificate_expiry_timestamp_seconds "))
            .and_then(|v| v.parse::<i64>().ok())
    };
    assert_eq!(
        metric(gw.admin("GET", "/metrics").await.1),
        Some(1_609_459_200)
    );
    write(&good.0, &good.1);
    unsafe { libc::kill(gw.child.id() as i32, libc::SIGHUP) };
    gw.wait_logged("reloaded the TLS certificate");
    assert_eq!(
        metric(gw.admin("GET", "/metrics").await.1),
        Some(not_after(&good.0))
    );
}

/// `check-config` passes the setup's config, saying `said`, and a gateway started on it
/// is ready: a warning, not a refusal.
async fn warned_then_started(setup: &Setup, said: &str) -> Gateway {
    let (code, err) = check_config(&setup.write_config());
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains(said), "{err}");
    let gw = setup.start();
    gw.wait_ready().await;
    gw
}

/// A server certificate issued for clients only (extendedKeyUsage clientAuth, as the CA
/// behind `client_ca` issues them) is served, and every verifying client refuses it: the
/// handshake's alert ("unsupported certificate") names no cause, and the gateway said
/// nothing of it. `check-config` and the start now say what is wrong with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_issued_for_clients_is_said_to_be_one() {
    let mut setup = Setup::new(None);
    let for_clients = setup.pki.client_san_only("localhost");
    setup
        .set("server", "cert", for_clients.cert.display().to_string())
        .set("server", "key", for_clients.key.display().to_string());
    let said = "extendedKeyUsage leaves out serverAuth";
    let gw = warned_then_started(&setup, said).await;
    let refused = setup.client().connect(&gw.url()).await.err();
    assert!(
        format!("{refused:?}").contains("InvalidPurpose"),
        "{refused:?}"
    );
    let log = gw.wait_logged(said);
    let cert = for_clients.cert.display().to_string();
    assert!(
        log.lines().any(|l| l.contains(said) && l.contains(&cert)),
        "{log}"
    );
}

/// A renewed certificate pasted beside a certificate that did not issue it (the CA's old
/// intermediate, or here its root) is served, and a client that holds only the root refuses
/// it: the issuer it needs is not sent. `check-config` and the start say so; the chain
/// as issued is served and said nothing of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_that_leaves_out_the_servers_issuer_is_warned_of() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut setup = Setup::new(None);
    let ca = |cn: &str| {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p
    };
    let root =
        CertifiedIssuer::self_signed(ca("chain root"), KeyPair::generate().unwrap()).unwrap();
    let inter =
        CertifiedIssuer::signed_by(ca("chain inter"), KeyPair::generate().unwrap(), &root).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .signed_by(&key, &inter)
        .unwrap();
    let dir = setup.dir.path().to_owned();
    let (cert, key_file, root_file) = (
        dir.join("chain.pem"),
        dir.join("chain.key"),
        dir.join("chain-root.pem"),
    );
    hoox_edge::config::write_private(&key_file, &key.serialize_pem()).unwrap();
    std::fs::write(&root_file, root.pem()).unwrap();
    std::fs::write(&cert, format!("{}{}", leaf.pem(), root.pem())).unwrap();
    setup.set("server", "cert", cert.display().to_string()).set(
        "server",
        "key",
        key_file.display().to_string(),
    );
    let said = "did not issue the server's (issued by CN=chain inter)";
    let gw = warned_then_started(&setup, said).await;
    let client = TlsClient::new(&root_file);
    let refused = client.connect(&gw.url()).await.err();
    assert!(
        format!("{refused:?}").contains("UnknownIssuer"),
        "{refused:?}"
    );
    gw.wait_logged(said);
    // As issued: served, and nothing said.
    std::fs::write(&cert, format!("{}{}", leaf.pem(), inter.pem())).unwrap();
    let (code, err) = check_config(&setup.write_config());
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("did not issue"), "{err}");
    unsafe { libc::kill(gw.child.id() as i32, libc::SIGHUP) };
    gw.wait_logged("reloaded the TLS certificate");
    assert!(client.connect(&gw.url()).await.is_ok());
    let log = gw.stderr();
    assert_eq!(log.matches(said).count(), 1, "{log}");
}

/// The gateway is not dumpable: no core dump writes its secrets out, and no other process
/// of its user attaches to it or reads its memory. The kernel gives `/proc/PID/environ` (and
/// `mem`) of a process that is not dumpable to root; of one that is, to its user, as a
/// `sleep` of the same user shows beside it (so the check could fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_leaves_no_core_dump_of_its_secrets() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    const NOBODY: u32 = 65534;
    let setup = Setup::new(None);
    setup.give_to(NOBODY);
    let mut cmd = setup.command();
    cmd.uid(NOBODY).gid(NOBODY);
    let gw = Gateway::spawn(cmd, &setup.pki.ca_cert);
    gw.wait_ready().await;
    let mut sleep = Command::new("sleep");
    let mut sleep = sleep.arg("30").uid(NOBODY).gid(NOBODY).spawn().unwrap();
    let owner = |pid: u32| {
        std::fs::metadata(format!("/proc/{pid}/environ"))
            .unwrap()
            .uid()
    };
    let (gateway, dumpable) = (owner(gw.child.id()), owner(sleep.id()));
    sleep.kill().unwrap();
    sleep.wait().unwrap();
    assert_eq!(dumpable, NOBODY, "a process of the user is its own");
    assert_eq!(gateway, 0, "the gateway is dumpable: {}", gw.stderr());
}
