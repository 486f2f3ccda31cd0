//! The admin face over real sockets (loopback TCP and a Unix socket) in front of a real
//! mutex on a real redb file.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use hoox_edge::admin::{self, Listen, State, client};
use hoox_edge::executor::Outstanding;
use hoox_edge::metrics::Metrics;
use hoox_edge::mutex::{self, ClientKey, Clock, Config, Decision, Key, Mode, Owner, Reserve};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

fn start_mutex(path: &Path) -> (mutex::Mutex, Owner) {
    let config = Config {
        path: path.to_path_buf(),
        reopen_backoff_max: Duration::from_millis(200),
        ..Config::default()
    };
    mutex::start(config, Clock::system())
}

/// One admin listener being served, and the means to stop it.
struct Admin {
    listen: Listen,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Admin {
    async fn start(listen: &Listen, state: State) -> Admin {
        let bound = admin::bind(listen).await.unwrap();
        let listen = bound.listen().unwrap();
        let (stop, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(admin::serve(bound, state, async {
            let _ = rx.await;
        }));
        Admin { listen, stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }

    async fn call(&self, method: &str, path: &str) -> (u16, Value) {
        let (status, body) = client::request(&self.listen, method, path).await.unwrap();
        let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        (status, v)
    }

    async fn text(&self, path: &str) -> (u16, String) {
        client::request(&self.listen, "GET", path).await.unwrap()
    }
}

fn state(mutex: &mutex::Mutex, ready: bool) -> State {
    State {
        mutex: mutex.clone(),
        metrics: Arc::new(Metrics::new()),
        ready: Arc::new(AtomicBool::new(ready)),
        stopping: Arc::new(AtomicBool::new(false)),
        stall_hook: false,
        outstanding: Arc::new(Outstanding::for_deadline(mutex.deadline())),
        restart_pending: Default::default(),
        reload_refused: Default::default(),
        executor: "paper",
    }
}

/// Both kinds of listener over the same state.
async fn both(dir: &Path, state: &State) -> [Admin; 2] {
    let tcp = Listen::parse("127.0.0.1:0").unwrap();
    let unix = Listen::Unix(dir.join("admin.sock"));
    [
        Admin::start(&tcp, state.clone()).await,
        Admin::start(&unix, state.clone()).await,
    ]
}

/// Samples of a Prometheus text answer, by series (`name{labels}`).
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, v) = l.rsplit_once(' ').unwrap();
            let v = if v == "+Inf" {
                f64::INFINITY
            } else {
                v.parse().unwrap()
            };
            (series.to_string(), v)
        })
        .collect()
}

/// A real owner on `dir`'s database, serving, and a ready admin state over it.
async fn serving(dir: &Path) -> (mutex::Mutex, Owner, State) {
    let (m, owner) = start_mutex(&dir.join("mutex.redb"));
    wait_serving(&m).await;
    let st = state(&m, true);
    (m, owner, st)
}

async fn wait_serving(m: &mutex::Mutex) {
    for _ in 0..200 {
        if let Ok(s) = m.ping().await
            && s.fail_closed.is_none()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the mutex never started serving");
}

fn reserve(key: &Key) -> Reserve {
    Reserve {
        key: key.clone(),
        ttl: Duration::from_secs(300),
        payload_hash: [7; 32],
        guard: None,
    }
}

#[tokio::test]
async fn failing_closed_is_not_ready_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    // A state directory that does not exist: the mutex can never open its database.
    let (m, owner) = start_mutex(&dir.path().join("missing").join("mutex.redb"));
    let st = state(&m, true);
    for a in both(dir.path(), &st).await {
        let (s, v) = a.call("GET", "/healthz").await;
        assert_eq!((s, v["status"].as_str()), (200, Some("ok")));

        let (s, v) = a.call("GET", "/readyz").await;
        assert_eq!(s, 503, "{v}");
        assert_eq!(v["code"], "NOT_READY");
        assert_eq!(v["reason"], "not_open");
        assert_eq!(v["status"], 503);

        let (s, v) = a.call("GET", "/status").await;
        assert_eq!(s, 200);
        assert_eq!(v["serving"], false);
        assert_eq!(v["ready"], false);
        assert_eq!(v["fail_closed"], "not_open");
        assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));

        // Everything that needs the owner answers 503, never a guess.
        for (method, path) in [
            ("GET", "/keys"),
            ("GET", "/keys/client:psk:live:order-1"),
            (
                "POST",
                "/keys/client:psk:live:order-1/release?entry=1.2.pending.0",
            ),
            ("POST", "/halt"),
            ("POST", "/resume"),
        ] {
            let (s, v) = a.call(method, path).await;
            assert_eq!(s, 503, "{method} {path}: {v}");
            assert_eq!(v["code"], "IDEMPOTENCY_UNAVAILABLE");
            assert_eq!(v["reason"], "not_open");
        }

        let (s, text) = a.text("/metrics").await;
        assert_eq!(s, 200);
        let m = samples(&text);
        assert_eq!(m.get("hoox_mutex_serving"), Some(&0.0));
        assert_eq!(m.get("hoox_mutex_live_keys"), Some(&0.0));
        a.stop().await;
    }
    // A clean stop removed the socket file.
    assert!(!dir.path().join("admin.sock").exists());
    owner.stop();
}

/// Until the supervisor has seen the first open (`ready` unset), `/readyz` says "starting"
/// when the owner reports no failure. The whole path, a folder missing then made, runs
/// against the binary in `tests/faults.rs` (`missing_state_directory`).
#[tokio::test]
async fn readyz_says_starting_until_the_first_open_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = start_mutex(&dir.path().join("mutex.redb"));
    let st = state(&m, false);
    let a = Admin::start(&Listen::parse("127.0.0.1:0").unwrap(), st).await;
    let (s, v) = a.call("GET", "/readyz").await;
    assert_eq!((s, v["reason"].as_str()), (503, Some("starting")));
    // The process is alive all the same.
    assert_eq!(a.call("GET", "/healthz").await.0, 200);
    a.stop().await;
    owner.stop();
}

/// HEAD is answered wherever GET is (an uptime probe's; RFC 9110 §9.3.2): the same
/// status, no body. It was 405.
#[tokio::test]
async fn head_is_answered_where_get_is() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, _owner, state) = serving(dir.path()).await;
    let a = Admin::start(&Listen::parse("127.0.0.1:0").unwrap(), state).await;
    for (path, status) in [("/healthz", 200), ("/readyz", 200), ("/metrics", 200)] {
        let (s, body) = client::request(&a.listen, "HEAD", path).await.unwrap();
        assert_eq!((s, body.as_str()), (status, ""), "{path}");
        assert_eq!(a.text(path).await.0, status, "GET {path}");
    }
    // Not where only POST is.
    let (s, _) = client::request(&a.listen, "HEAD", "/halt").await.unwrap();
    assert_eq!(s, 405);
}

#[tokio::test]
async fn bad_requests_are_refused_before_the_mutex_is_asked() {
    // The mutex fails closed (its directory is missing): any request that reached it would
    // be answered 503, so a 400, 404 or 405 below proves it was never asked.
    let dir = tempfile::tempdir().unwrap();
    let (m, owner) = start_mutex(&dir.path().join("missing").join("mutex.redb"));
    let a = Admin::start(&Listen::parse("127.0.0.1:0").unwrap(), state(&m, true)).await;
    for path in ["/keys/client:a:live:b", "/keys?limit=10"] {
        let (s, v) = a.call("GET", path).await;
        assert_eq!(s, 503, "{path} asks the mutex: {v}");
    }
    for (method, path, status, code) in [
        ("GET", "/nope", 404, "NOT_FOUND"),
        ("GET", "/", 404, "NOT_FOUND"),
        ("POST", "/healthz", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/halt", 405, "METHOD_NOT_ALLOWED"),
        ("DELETE", "/keys/client:a:live:b", 405, "METHOD_NOT_ALLOWED"),
        (
            "GET",
            "/keys/client:a:live:b/release",
            405,
            "METHOD_NOT_ALLOWED",
        ),
        ("GET", "/keys/other:x", 400, "INVALID_KEY"),
        ("GET", "/keys/client:a:live:%zz", 400, "INVALID_KEY"),
        ("GET", "/keys/client:a:live:%09", 400, "INVALID_KEY"),
        ("GET", "/keys/client:a:live:%C3%A9", 400, "INVALID_KEY"),
        ("POST", "/keys/%2Fx/release", 400, "INVALID_KEY"),
        ("GET", "/keys?limit=0", 400, "INVALID_REQUEST"),
        ("GET", "/keys?limit=ten", 400, "INVALID_REQUEST"),
        ("GET", "/keys?limit=10001", 400, "INVALID_REQUEST"),
        ("GET", "/keys?offset=3", 400, "INVALID_REQUEST"),
        (
            "POST",
            "/keys/client:a:live:b/release?force=2",
            400,
            "INVALID_REQUEST",
        ),
        (
            "POST",
            "/keys/client:a:live:b/release?entry=X",
            400,
            "INVALID_REQUEST",
        ),
        (
            "POST",
            "/keys/client:a:live:b/release?force=1",
            400,
            "INVALID_REQUEST",
        ),
        (
            "POST",
            "/keys/client:a:live:b/release",
            400,
            "INVALID_REQUEST",
        ),
        (
            "POST",
            "/keys/client:a:live:b/release?force=1&force=1&entry=1.2.pending",
            400,
            "INVALID_REQUEST",
        ),
    ] {
        let (s, v) = a.call(method, path).await;
        assert_eq!(
            (s, v["code"].as_str()),
            (status, Some(code)),
            "{method} {path}"
        );
        assert_eq!(v["type"], "about:blank");
        assert_eq!(v["status"], status);
    }
    // A key of no stored form is said to be that, in the operator's terms.
    let (_, v) = a.call("GET", "/keys/order-42").await;
    let detail = v["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with("not a key of a form the gateway stores: client:"),
        "{v}"
    );
    let (s, body) = client::request(&a.listen, "POST", "/status").await.unwrap();
    assert_eq!(s, 405, "{body}");
    a.stop().await;
    owner.stop();
}

#[tokio::test]
async fn the_unix_socket_is_private_and_only_stale_files_are_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin.sock");
    let listen = Listen::Unix(path.clone());

    // A socket left behind by a dead process is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let bound = admin::bind(&listen).await.unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    // A live one is not.
    let err = admin::bind(&listen).await.err().unwrap();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    drop(bound);
    assert!(!path.exists(), "dropping the listener removes its socket");

    // Nor is anything that is not a socket.
    std::fs::write(&path, b"precious").unwrap();
    assert!(admin::bind(&listen).await.is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
}

#[tokio::test]
async fn a_bound_port_is_reported_at_bind() {
    let first = admin::bind(&Listen::parse("127.0.0.1:0").unwrap())
        .await
        .unwrap();
    let addr = first.local_addr().unwrap();
    assert_ne!(addr.port(), 0);
    assert!(admin::bind(&Listen::Tcp(addr)).await.is_err());
}

#[tokio::test]
async fn the_client_reports_a_listener_that_is_not_there() {
    let dir = tempfile::tempdir().unwrap();
    let gone = Listen::Unix(dir.path().join("nobody.sock"));
    let err = client::request(&gone, "GET", "/healthz").await.unwrap_err();
    assert!(matches!(err, client::ClientError::Connect { .. }), "{err}");
}

// The tests below need the real owner (branch `mutex`).

/// Past its connection bound, the admin face answers at once, 503 `ADMIN_BUSY`, and does
/// nothing: a command left in the kernel's backlog was read once a connection freed, and
/// a `resume` the operator was told had failed (exit 69 after 10 s) took the kill switch
/// off. Past twice the bound, it closes the connection unread, and the client says so.
/// Over both kinds of listener.
#[tokio::test]
async fn a_command_past_the_connection_bound_is_refused_and_never_applied() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner, st) = serving(dir.path()).await;
    for a in both(dir.path(), &st).await {
        // Every connection the face serves, held open without a request (as a script's
        // kept-alive ones are): each holds its turn until the head timeout (10 s).
        let open = || async {
            match &a.listen {
                Listen::Tcp(addr) => Box::new(tokio::net::TcpStream::connect(addr).await.unwrap())
                    as Box<dyn std::any::Any + Send>,
                Listen::Unix(path) => {
                    Box::new(tokio::net::UnixStream::connect(path).await.unwrap())
                }
            }
        };
        let mut held = Vec::new();
        for _ in 0..32 {
            held.push(open().await);
        }
        let (s, v) = tokio::time::timeout(Duration::from_secs(5), a.call("POST", "/halt"))
            .await
            .unwrap_or_else(|_| panic!("{}: no answer past the bound", a.listen));
        assert_eq!((s, v["code"].as_str()), (503, Some("ADMIN_BUSY")), "{v}");
        // As many more, silent, hold every busy answer's turn (for its 1 s head timeout):
        // the next is closed unread, and the client says so, not hyper's "operation was
        // canceled".
        for _ in 0..32 {
            held.push(open().await);
        }
        let err = client::request(&a.listen, "POST", "/halt")
            .await
            .expect_err("answered past twice the bound");
        assert!(
            matches!(err, client::ClientError::Closed { .. })
                && err.to_string().contains("past 64 open at once"),
            "{}: {err}",
            a.listen
        );
        // The turns free: the refused commands are not read then.
        drop(held);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (s, v) = a.call("GET", "/status").await;
        assert_eq!((s, v["halted"].as_bool()), (200, Some(false)), "{v}");
        assert!(!m.is_halted());
        a.stop().await;
    }
    owner.stop();
}

/// What the face answers `request`, sent as written on a connection of its own.
async fn raw_answer(listen: &impl std::fmt::Display, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(listen.to_string())
        .await
        .unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    answer
}

#[tokio::test]
async fn halt_is_persisted_and_readiness_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("mutex.redb");
    let (m, owner) = start_mutex(&db);
    wait_serving(&m).await;
    let st = state(&m, true);
    let a = Admin::start(&Listen::parse("127.0.0.1:0").unwrap(), st.clone()).await;
    let (s, v) = a.call("GET", "/readyz").await;
    assert_eq!(s, 200, "{v}");
    let (_, v) = a.call("GET", "/status").await;
    assert_eq!(
        (v["serving"].as_bool(), v["halted"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(v["fail_closed"], Value::Null);

    // A browser's POST (it always carries Origin) is refused, and changes nothing.
    let answer = raw_answer(
        &a.listen,
        "POST /halt HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://example.com\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(!m.is_halted());
    // Nor is what a web page's GETs ask, which it cannot read but which still cost the
    // owner a turn each: a script's fetch (Origin), an image or a link's (Sec-Fetch-Site,
    // from another site or this one's other port). An address typed into the browser, or
    // a tool that sends neither, is the operator's.
    for (headers, want) in [
        ("Origin: http://evil.example\r\n", "403"),
        (
            "Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: no-cors\r\n",
            "403",
        ),
        ("Sec-Fetch-Site: same-site\r\n", "403"),
        (
            "Sec-Fetch-Site: none\r\nSec-Fetch-Mode: navigate\r\n",
            "200",
        ),
        ("Sec-Fetch-Site: same-origin\r\n", "200"),
        ("", "200"),
    ] {
        let request = format!(
            "GET /keys?limit=10000 HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Connection: close\r\n\r\n"
        );
        let answer = raw_answer(&a.listen, &request).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {want}")),
            "{headers}: {answer}"
        );
    }
    // A page whose name was rebound to 127.0.0.1 reads nothing either: its Host is its
    // own name. An address or localhost, with or without a port, is an operator's.
    for (host, want) in [
        ("rebound.example:9980", "403"),
        ("localhost.example", "403"),
        ("localhost", "200"),
        ("LOCALHOST:9980", "200"),
        ("127.0.0.1:9980", "200"),
        ("[::1]:9980", "200"),
        ("::1", "200"),
    ] {
        let request = format!("GET /keys HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let answer = raw_answer(&a.listen, &request).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {want}")),
            "{host}: {answer}"
        );
    }

    let (s, v) = a.call("POST", "/halt").await;
    assert_eq!((s, v["halted"].as_bool()), (200, Some(true)));
    let (s, v) = a.call("GET", "/readyz").await;
    assert_eq!((s, v["reason"].as_str()), (503, Some("halted")));
    assert!(m.is_halted());
    let (_, text) = a.text("/metrics").await;
    assert_eq!(samples(&text).get("hoox_mutex_halted"), Some(&1.0));
    a.stop().await;
    owner.stop();

    // Same file, new process: still halted.
    let (m, owner) = start_mutex(&db);
    wait_serving(&m).await;
    let a = Admin::start(&Listen::parse("127.0.0.1:0").unwrap(), state(&m, true)).await;
    let (_, v) = a.call("GET", "/status").await;
    assert_eq!(v["halted"], true, "{v}");
    assert_eq!(a.call("GET", "/readyz").await.0, 503);

    let (s, v) = a.call("POST", "/resume").await;
    assert_eq!((s, v["halted"].as_bool()), (200, Some(false)));
    assert_eq!(a.call("GET", "/readyz").await.0, 200);
    assert!(!m.is_halted());
    a.stop().await;
    owner.stop();
}

#[tokio::test]
async fn an_owner_that_does_not_answer_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        path: dir.path().join("mutex.redb"),
        // Long enough that an answering owner (a slow fsync included) meets it; the stall
        // below outlasts the two pings that wait on it, one after the other.
        deadline: Duration::from_secs(1),
        ..Config::default()
    };
    let (m, owner) = mutex::start_with(config, Clock::system(), true);
    wait_serving(&m).await;
    let a = Admin::start(&Listen::parse("127.0.0.1:0").unwrap(), state(&m, true)).await;
    assert_eq!(a.call("GET", "/readyz").await.0, 200);

    // The disk stalls: the owner sleeps and misses the ping's deadline.
    m.stall(Duration::from_secs(5)).await.unwrap();
    let (s, v) = a.call("GET", "/readyz").await;
    assert_eq!((s, v["reason"].as_str()), (503, Some("timeout")), "{v}");
    let (s, v) = a.call("GET", "/status").await;
    assert_eq!(s, 200);
    assert_eq!(
        (v["serving"].as_bool(), v["fail_closed"].as_str()),
        (Some(false), Some("timeout"))
    );
    // Liveness is the process, not the owner: systemd's watchdog judges the owner.
    assert_eq!(a.call("GET", "/healthz").await.0, 200);
    a.stop().await;
    owner.stop();
}

/// What a release at `path` answered: its status, and its problem's `code`, or
/// `released` for a release made (the body, for anything else).
async fn release_answer(a: &Admin, path: &str) -> (u16, String) {
    let (s, v) = a.call("POST", path).await;
    let what = match (v["code"].as_str(), v["released"].as_bool()) {
        (Some(code), _) => code.to_string(),
        (None, Some(true)) => "released".to_string(),
        _ => v.to_string(),
    };
    (s, what)
}

#[tokio::test]
async fn keys_are_listed_shown_and_released_by_the_operator() {
    let dir = tempfile::tempdir().unwrap();
    let (m, owner, st) = serving(dir.path()).await;
    // A client key with a slash and a space, so the path must be encoded to reach it.
    let ck = ClientKey::parse("order/1 a%").unwrap();
    let key = Key::client("psk", Mode::Live, &ck).unwrap();
    let other = Key::from_stored("trade:binance:BTCUSDT:LONG:1:live:29312345").unwrap();
    assert!(matches!(
        m.reserve(reserve(&key)).await,
        Decision::Proceed(_)
    ));
    assert!(matches!(
        m.reserve(reserve(&other)).await,
        Decision::Proceed(_)
    ));
    assert!(matches!(
        m.reserve(reserve(&key)).await,
        Decision::Duplicate(_)
    ));

    let encoded = client::encode_key(key.as_str());
    for a in both(dir.path(), &st).await {
        let (s, v) = a.call("GET", "/keys").await;
        assert_eq!(s, 200, "{v}");
        let listed: Vec<&str> = v["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["key"].as_str().unwrap())
            .collect();
        assert_eq!(listed.len(), 2, "{v}");
        assert!(listed.contains(&key.as_str()) && listed.contains(&other.as_str()));
        assert_eq!(v["truncated"], false);

        let (s, v) = a.call("GET", "/keys?limit=1").await;
        assert_eq!(s, 200);
        assert_eq!(v["keys"].as_array().unwrap().len(), 1);
        assert_eq!(v["truncated"], true);
        // A limit of exactly the number of keys leaves nothing out.
        let (s, v) = a.call("GET", "/keys?limit=2").await;
        assert_eq!(s, 200);
        assert_eq!(v["keys"].as_array().unwrap().len(), 2);
        assert_eq!(v["truncated"], false, "{v}");

        let (s, v) = a.call("GET", &format!("/keys/{encoded}")).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["key"], key.as_str());
        assert_eq!(v["state"], "pending");
        assert_eq!(v["has_response"], false);
        let ttl = v["expires_at"].as_u64().unwrap() - v["stored_at"].as_u64().unwrap();
        assert_eq!(ttl, 300_000);
        assert!(v["expires_in_ms"].as_u64().unwrap() <= 300_000);

        let (_, text) = a.text("/metrics").await;
        let s = samples(&text);
        assert_eq!(s.get("hoox_mutex_live_keys"), Some(&2.0));
        assert_eq!(s.get("hoox_mutex_proceeds_total"), Some(&2.0));
        assert_eq!(s.get("hoox_mutex_duplicates_total"), Some(&1.0));
        assert!(s["hoox_mutex_reserves_total"] >= 3.0);
        assert!(s["hoox_mutex_fsync_seconds_count"] >= 1.0);
        a.stop().await;
    }

    let marks = st.outstanding.clone();
    let a = Admin::start(&Listen::Unix(dir.path().join("admin.sock")), st).await;
    let release = format!("/keys/{encoded}/release");
    let show = format!("/keys/{encoded}");
    let entry = |v: &serde_json::Value| v["entry"].as_str().expect("an entry tag").to_string();
    let answer = async |path: String| release_answer(&a, &path).await;
    let changed = (409, "KEY_CHANGED".to_string());
    let in_flight = (409, "ORDER_IN_FLIGHT".to_string());
    let released = (200, "released".to_string());
    // Pinned to the entry the operator saw: another one (a retry's, that took the key
    // since) is left alone.
    let (_, shown) = a.call("GET", &show).await;
    let seen = entry(&shown);
    // Pending, no order out: its outcome unknown, as a duplicate's 409 says it.
    assert_eq!(
        (&shown["in_flight"], &shown["order"]),
        (&json!(false), &json!("unknown"))
    );
    assert_eq!(
        answer(format!("{release}?entry=1.2.pending")).await,
        changed
    );
    // Its order out (the key marked, the mark bound to this entry): refused unforced;
    // force needs the entry.
    let seq = |tag: &str| tag.split('.').next().unwrap().parse::<u64>().unwrap();
    let out = marks.begin(&key, None);
    out.bind(&key, seq(&seen));
    let (_, shown) = a.call("GET", &show).await;
    assert_eq!(
        (&shown["in_flight"], &shown["order"]),
        (&json!(true), &json!("in_flight"))
    );
    let out_tag = entry(&shown);
    assert!(out_tag.contains(".out."), "{out_tag}");
    let pinned = |tag: &str| format!("{release}?entry={tag}");
    assert_eq!(answer(pinned(&out_tag)).await, in_flight);
    assert_eq!(
        answer(format!("{release}?force=1")).await,
        (400, "INVALID_REQUEST".to_string())
    );
    // Seen before its order went out: not the entry the operator judged.
    let forced = |tag: &str| format!("{release}?force=1&entry={tag}");
    assert_eq!(answer(forced(&seen)).await, changed);
    // Seen out, and out still: the force the operator meant, counted as an operator's.
    let (_, text) = a.text("/metrics").await;
    assert_eq!(
        samples(&text).get("hoox_mutex_operator_releases_total"),
        Some(&0.0)
    );
    assert_eq!(answer(forced(&out_tag)).await, released);
    let (_, text) = a.text("/metrics").await;
    assert_eq!(
        samples(&text).get("hoox_mutex_operator_releases_total"),
        Some(&1.0)
    );
    drop(out);
    // Seen out; the order ends, its commit lost (dropped with the queue full): the entry
    // is pending and unmarked, a filled trade as far as anyone knows, and a release with
    // the look from while it was out is refused.
    let out = marks.begin(&key, None);
    let Decision::Proceed(lost) = m.reserve(reserve(&key)).await else {
        panic!("a released key is granted")
    };
    out.granted(&lost);
    let (_, shown) = a.call("GET", &show).await;
    let out_tag = entry(&shown);
    drop(out);
    assert_eq!(answer(pinned(&out_tag)).await, changed);
    let (_, shown) = a.call("GET", &show).await;
    assert_eq!(answer(pinned(&entry(&shown))).await, released);
    // An entry seen pending and committed since is not the entry the operator judged.
    let Decision::Proceed(grant) = m.reserve(reserve(&key)).await else {
        panic!("a released key is granted")
    };
    let (_, pending) = a.call("GET", &show).await;
    m.commit(grant, None).unwrap();
    // The commit is queued, not awaited: it shows once the owner has taken it.
    let mut committed = None;
    for _ in 0..1_000 {
        let (_, v) = a.call("GET", &show).await;
        if v["state"] == "committed" {
            committed = Some(v);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let committed = committed.expect("the commit shows within 10 s");
    assert_ne!(entry(&committed), seen, "another entry, another tag");
    // Seen pending, filled since: the operator's look no longer holds.
    assert_eq!(answer(pinned(&entry(&pending))).await, changed);
    // Marked (a retry's reserve, or an order the operator forced past), a committed key
    // is released by force with the tag of the committed entry.
    let mark = marks.begin(&key, None);
    mark.bind(&key, seq(&entry(&committed)));
    assert_eq!(answer(pinned(&entry(&committed))).await, in_flight);
    let (s, v) = a.call("POST", &forced(&entry(&committed))).await;
    assert_eq!((s, v["released"].as_bool()), (200, Some(true)), "{v}");
    assert_eq!(v["key"], key.as_str());
    let (s, v) = a.call("GET", &format!("/keys/{encoded}")).await;
    assert_eq!((s, v["code"].as_str()), (404, Some("KEY_NOT_FOUND")));
    let (s, _) = a.call("POST", &pinned(&entry(&committed))).await;
    assert_eq!(s, 404, "a second release finds nothing");

    // The retry the operator unblocked now runs; the other key is untouched.
    assert!(matches!(
        m.reserve(reserve(&key)).await,
        Decision::Proceed(_)
    ));
    let other_show = format!("/keys/{}", other.as_str());
    let (s, before) = a.call("GET", &other_show).await;
    assert_eq!(s, 200);
    let (_, text) = a.text("/metrics").await;
    assert_eq!(samples(&text).get("hoox_mutex_live_keys"), Some(&2.0));
    a.stop().await;
    owner.stop();

    // A look from before a restart (which may have lost a commit carried in memory, so
    // that a filled trade reads pending again) does not hold after it.
    let (_, owner, st) = serving(dir.path()).await;
    let a = Admin::start(&Listen::parse("127.0.0.1:0").unwrap(), st).await;
    let (_, after) = a.call("GET", &other_show).await;
    assert_eq!(after["state"], before["state"]);
    assert_ne!(
        entry(&after),
        entry(&before),
        "the same entry, another load"
    );
    let release_other =
        |v: &serde_json::Value| format!("/keys/{}/release?entry={}", other.as_str(), entry(v));
    let changed = (409, "KEY_CHANGED".to_string());
    assert_eq!(release_answer(&a, &release_other(&before)).await, changed);
    let released = (200, "released".to_string());
    assert_eq!(release_answer(&a, &release_other(&after)).await, released);
    a.stop().await;
    owner.stop();
}
