//! The operator's face: health, readiness, metrics, keys (loopback or Unix socket).
//!
//! It has no authentication, so it only listens where the machine's own users decide who
//! may connect: a loopback address, or a Unix socket created mode 0600. Every answer is
//! JSON, errors are `application/problem+json`, except `/metrics`.
//!
//! | route                      | answer                                                      |
//! |----------------------------|-------------------------------------------------------------|
//! | `GET /healthz`             | 200 while the process runs                                  |
//! | `GET /readyz`              | 200: database open, owner answering, serving, not full, not halted |
//! | `GET /metrics`             | Prometheus text                                             |
//! | `GET /status`              | `{live_keys, halted, serving, fail_closed, detail, ready, orders_in_flight, restart_pending, reload_refused, executor, version}`|
//! | `GET /keys?limit=N`        | `{keys: [entry], truncated}`, by wall clock expiry, oldest first |
//! | `GET /keys/{key}`          | one entry, 404 if no live entry                             |
//! | `POST /keys/{key}/release?entry=TAG` | `{key, released, in_flight}`: operator release of the entry `keys show` gave (TAG), as it was seen; 400 without one; 404 no live entry; 409 `ORDER_IN_FLIGHT` (`&force=1` overrides) or `KEY_CHANGED` (settled, taken again, or reloaded, meanwhile) |
//! | `POST /halt`, `/resume`    | the kill switch, persisted by the mutex                     |
//!
//! `{key}` is the stored key, percent-encoded as [`client::encode_key`] does.

pub mod client;

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::executor::Outstanding;
use crate::metrics::{self, Metrics};
use crate::mutex::{
    EntryInfo, Key, KeyError, Mutex, Released, Seen, State as EntryState, Unavailable,
};

/// Connections served at once. An operator's tools need a handful; the bound keeps a
/// runaway script from starving the gateway. One more is answered 503 `ADMIN_BUSY` at
/// once, not left in the kernel's backlog: read there once a connection freed, a command
/// its client had given up on (`resume`, exit 69 after 10 s) was applied after all.
const MAX_CONNECTIONS: usize = 32;
/// Connections past the bound being told so at once; past these, closed unanswered.
const MAX_TOLD_BUSY: usize = 32;
/// How long a connection past the bound has to send the head its 503 answers.
const BUSY_HEADER_TIMEOUT: Duration = Duration::from_secs(1);
/// A client that has not sent its request head by then is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight admin requests may take to finish at shutdown.
const DRAIN: Duration = Duration::from_secs(5);
/// How long `/readyz` waits, before the first open, for the owner to say why it is not open.
const STARTING_PING: Duration = Duration::from_millis(200);
/// `/keys` without `limit`, and the most one answer may hold.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 10_000;

/// Where the admin face listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Listen {
    /// `"127.0.0.1:9980"`, `"[::1]:9980"` or `"unix:/run/hoox-edge/admin.sock"`.
    pub fn parse(s: &str) -> Result<Listen, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("admin listen \"unix:\" needs a socket path".into());
            }
            return Listen::unix(PathBuf::from(path));
        }
        let addr: SocketAddr = s.parse().map_err(|_| {
            format!(
                "admin listen {s:?} is neither an address like \"127.0.0.1:9980\" nor \
                 \"unix:/path/to/admin.sock\""
            )
        })?;
        if !addr.ip().to_canonical().is_loopback() {
            return Err(format!(
                "admin listen {s:?} is not a loopback address: the admin face has no \
                 authentication, so it listens only on 127.0.0.1, ::1 or a Unix socket"
            ));
        }
        Ok(Listen::Tcp(addr))
    }

    /// As [`Listen::parse`], for a config file: a relative socket path is taken from
    /// `base`, the file's folder, as every path in it is.
    pub fn parse_in(s: &str, base: &Path) -> Result<Listen, String> {
        match Listen::parse(s)? {
            Listen::Unix(p) if p.is_relative() => Listen::unix(base.join(p)),
            l => Ok(l),
        }
    }

    /// A socket at `path`, which must fit a socket address: 107 bytes, and the NUL.
    fn unix(path: PathBuf) -> Result<Listen, String> {
        const SUN_PATH: usize = 108;
        let len = path.as_os_str().len();
        if len >= SUN_PATH {
            return Err(format!(
                "admin listen socket path {} is {len} bytes; a Unix socket's path is at \
                 most {} bytes",
                path.display(),
                SUN_PATH - 1
            ));
        }
        Ok(Listen::Unix(path))
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Tcp(a) => write!(f, "{a}"),
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// What the handlers read.
#[derive(Clone)]
pub struct State {
    pub mutex: Mutex,
    pub metrics: Arc<Metrics>,
    /// Set once the mutex's database has opened (`app`'s supervisor, on the owner's first
    /// ping that is not failing closed); `/readyz` is 503 before. The gateway's listener is
    /// bound earlier still, at start, so readiness waits on the database alone.
    pub ready: Arc<AtomicBool>,
    /// Set when shutdown begins: `/readyz` is 503 while in-flight requests drain, so that
    /// a load balancer stops sending before the listener closes.
    pub stopping: Arc<AtomicBool>,
    /// Whether `POST /debug/stall` exists (fault tests only).
    pub stall_hook: bool,
    /// The keys whose order is at the executor now (`Gateway::outstanding`).
    pub outstanding: Arc<Outstanding>,
    /// The config keys changed since the start that only a restart applies, as the last
    /// reload found them (`app`): `/status` lists them for a gateway not run by systemd.
    pub restart_pending: Arc<std::sync::Mutex<Vec<String>>>,
    /// Why the last reload was refused, `None` once one applies (`app`).
    pub reload_refused: Arc<std::sync::Mutex<Option<String>>>,
    /// The executor's kind, `paper` or `http` (`ExecutorKind::kind`): `/status` says it.
    pub executor: &'static str,
}

/// A bound admin listener, not yet serving. Binding first lets `run` report a busy port
/// or a bad socket path at start, before anything else is up.
pub struct Bound {
    listener: Listener,
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, SocketFile),
}

/// Removes the socket file when the listener goes, so a clean stop leaves nothing behind.
/// The socket this gateway bound, removed at its stop only if it is still the one at the
/// path (its device and inode): another's, bound there since, is not ours to take away.
struct SocketFile(PathBuf, Option<(u64, u64)>);

impl SocketFile {
    fn of(path: &Path) -> SocketFile {
        SocketFile(path.to_owned(), identity(path))
    }
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if self.1.is_some() && identity(&self.0) == self.1 {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl Bound {
    /// The bound TCP address (a port-0 bind learns its port here); `None` for a socket.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.listener {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix(..) => None,
        }
    }

    /// Where a client reaches this listener.
    pub fn listen(&self) -> Option<Listen> {
        match &self.listener {
            Listener::Tcp(l) => l.local_addr().ok().map(Listen::Tcp),
            Listener::Unix(_, f) => Some(Listen::Unix(f.0.clone())),
        }
    }
}

/// Binds the admin listener. A Unix socket replaces a stale socket file (one nobody
/// answers on), but never a live socket nor any other kind of file.
pub async fn bind(listen: &Listen) -> io::Result<Bound> {
    let listener = match listen {
        Listen::Tcp(addr) => Listener::Tcp(TcpListener::bind(addr).await?),
        Listen::Unix(path) => {
            remove_stale_socket(path).await?;
            let l = bind_private(path)?;
            let file = SocketFile::of(path);
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            Listener::Unix(l, file)
        }
    };
    Ok(Bound { listener })
}

/// A socket made at `path` with no access for group or others from its first moment: a
/// socket takes its mode from the umask at its bind, and one made under `umask 000` and
/// only then chmodded let another local user connect in between, and keep that connection
/// (`halt`, `keys release --force`). The umask is the process's, so it is narrowed for the
/// bind alone: the gateway binds before its mutex's thread starts, and anything another
/// thread made meanwhile would only be more private (0700 folders, 0600 files).
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    // SAFETY: umask only swaps the process's mask, and cannot fail.
    let before = unsafe { libc::umask(0o077) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above; the mask found is put back.
    unsafe { libc::umask(before) };
    bound
}

/// Why no socket can be made at `path`, if a file or folder stands there: only a socket
/// left behind is ours to replace. Asked at the bind, and by the config's check first.
pub fn taken_by_other_than_a_socket(path: &Path) -> Option<String> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    (!meta.file_type().is_socket())
        .then(|| format!("{} exists and is not a socket", path.display()))
}

/// A socket left at `path` by a process that stopped is replaced; one whose listener may
/// still be there is not. Only a refused connection says nobody listens: a socket of a
/// gateway running as another user refuses permission, one whose backlog is full asks to
/// try again, and taking the path from under either had `halt` halt the wrong gateway
/// while the first went on trading.
async fn remove_stale_socket(path: &Path) -> io::Result<()> {
    if let Some(why) = taken_by_other_than_a_socket(path) {
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, why));
    }
    match tokio::net::UnixStream::connect(path).await {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("another process is listening on {}", path.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                done => done,
            }
        }
        Err(e) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{} may belong to a running process ({e}): not replaced; stop it, or give \
                 this gateway another path",
                path.display()
            ),
        )),
    }
}

/// Serves until `shutdown` completes, then lets in-flight requests finish (briefly).
pub async fn serve(
    bound: Bound,
    state: State,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let state = Arc::new(state);
    let graceful = GracefulShutdown::new();
    let turns = Turns {
        served: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        told_busy: Arc::new(Semaphore::new(MAX_TOLD_BUSY)),
    };
    let mut shutdown = std::pin::pin!(shutdown);
    let mut accept_failed =
        crate::platform::log::Throttled::new(crate::platform::log::REPEATED_EVERY);
    loop {
        let accepted = tokio::select! {
            r = accept(&bound.listener, &state, &graceful, &turns) => r,
            () = &mut shutdown => break,
        };
        if let Err(e) = accepted {
            // Out of descriptors and the like: passing, and not worth stopping the
            // admin face for. A short pause keeps the loop from spinning.
            if let Some(n) = accept_failed.say(std::time::Instant::now()) {
                log::warn!("admin accept failed {n} time(s) since the last such warning: {e}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        log::warn!("admin connections still open after {DRAIN:?}; closing them");
    }
    Ok(())
}

/// The connections served, and those told the face is busy.
struct Turns {
    served: Arc<Semaphore>,
    told_busy: Arc<Semaphore>,
}

async fn accept(
    listener: &Listener,
    state: &Arc<State>,
    graceful: &GracefulShutdown,
    turns: &Turns,
) -> io::Result<()> {
    match listener {
        Listener::Tcp(l) => spawn_connection(l.accept().await?.0, state, graceful, turns),
        Listener::Unix(l, _) => spawn_connection(l.accept().await?.0, state, graceful, turns),
    }
    Ok(())
}

fn spawn_connection<S>(io: S, state: &Arc<State>, graceful: &GracefulShutdown, turns: &Turns)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (permit, busy): (OwnedSemaphorePermit, bool) =
        match turns.served.clone().try_acquire_owned() {
            Ok(p) => (p, false),
            Err(_) => match turns.told_busy.clone().try_acquire_owned() {
                Ok(p) => (p, true),
                // A flood: closed unanswered, and nothing it sent is read.
                Err(_) => return,
            },
        };
    let state = state.clone();
    let svc = service_fn(move |req| {
        let state = state.clone();
        async move {
            Ok::<_, Infallible>(if busy {
                busy_answer()
            } else {
                route(&state, req).await
            })
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(if busy {
            BUSY_HEADER_TIMEOUT
        } else {
            HEADER_TIMEOUT
        });
    if busy {
        builder.keep_alive(false);
    }
    let conn = graceful.watch(builder.serve_connection(TokioIo::new(io), svc));
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            log::debug!("admin connection ended: {e}");
        }
        drop(permit);
    });
}

type Answer = Response<Full<Bytes>>;

/// What a path asks for. Each route answers one method.
enum Route<'a> {
    Health,
    Ready,
    Metrics,
    Status,
    List,
    /// The still percent-encoded key.
    Show(&'a str),
    Release(&'a str),
    Halt(bool),
    /// Test hook: stall the owner loop, as a wedged disk would.
    Stall,
}

fn resolve(path: &str) -> Option<(Method, Route<'_>)> {
    Some(match path {
        "/healthz" => (Method::GET, Route::Health),
        "/readyz" => (Method::GET, Route::Ready),
        "/metrics" => (Method::GET, Route::Metrics),
        "/status" => (Method::GET, Route::Status),
        "/keys" => (Method::GET, Route::List),
        "/halt" => (Method::POST, Route::Halt(true)),
        "/resume" => (Method::POST, Route::Halt(false)),
        "/debug/stall" => (Method::POST, Route::Stall),
        _ => {
            let rest = path.strip_prefix("/keys/")?;
            // `/release` is matched on the raw path, before decoding, so a key whose own
            // text ends in "/release" (sent as %2Frelease) is not mistaken for it.
            match rest.strip_suffix("/release") {
                Some(raw) => (Method::POST, Route::Release(raw)),
                None => (Method::GET, Route::Show(rest)),
            }
        }
    })
}

async fn route(state: &State, req: Request<Incoming>) -> Answer {
    let Some((allowed, route)) = resolve(req.uri().path()) else {
        return problem(StatusCode::NOT_FOUND, "NOT_FOUND", "no such admin route");
    };
    // HEAD wherever GET is answered (RFC 9110 §9.3.2; an uptime probe's): hyper writes no
    // body to a HEAD over HTTP/1.1, the face's one protocol.
    let head = req.method() == Method::HEAD && allowed == Method::GET;
    if req.method() != allowed && !head {
        return not_allowed(&allowed);
    }
    // DNS rebinding: a web page whose own name was made to resolve to 127.0.0.1 could
    // read this face as same-origin (keys, status, metrics); its requests carry that name
    // in Host. Operator tools send `localhost` or an address.
    if !local_host(req.headers().get(hyper::header::HOST)) {
        return problem(
            StatusCode::FORBIDDEN,
            "FORBIDDEN",
            "the Host header must be localhost or an IP address",
        );
    }
    // A browser on this host could otherwise send here what any web page asks: a POST
    // (halt, resume, release), or GETs it cannot read but that still cost the owner a
    // turn each (`/keys?limit=10000`, in a loop). Browsers send Origin with every POST
    // and with a script's fetch, and `Sec-Fetch-Site` with every request; operator tools
    // send neither. An address typed into the browser (`none`) is the operator's own.
    if from_a_web_page(req.headers()) {
        return problem(
            StatusCode::FORBIDDEN,
            "FORBIDDEN",
            "requests from a web page are refused",
        );
    }
    match route {
        Route::Health => ok(json!({"status": "ok"})),
        Route::Ready => readyz(state).await,
        Route::Metrics => metrics(state),
        Route::Status => status(state).await,
        Route::List => list(state, req.uri().query().unwrap_or("")).await,
        Route::Show(raw) => show(state, raw).await,
        Route::Release(raw) => release(state, raw, req.uri().query().unwrap_or("")).await,
        Route::Halt(on) => halt(state, on).await,
        Route::Stall => stall(state, req.uri().query().unwrap_or("")),
    }
}

/// Whether a browser sent the request for a web page: it carries `Origin`, or a
/// `Sec-Fetch-Site` other than `none` (typed into the address bar) or `same-origin` (a
/// page of this face's own, which serves none).
fn from_a_web_page(headers: &hyper::HeaderMap) -> bool {
    let site = headers.get("sec-fetch-site").map(|v| v.as_bytes());
    headers.contains_key(hyper::header::ORIGIN)
        || site.is_some_and(|s| s != b"none" && s != b"same-origin")
}

/// Whether `Host` names this machine as only it can be named: `localhost`, or an IP
/// address (a page served from a name never has one of these as its origin). No Host at
/// all (HTTP/1.0) is fine too: no browser sends that.
fn local_host(host: Option<&hyper::header::HeaderValue>) -> bool {
    let Some(host) = host else { return true };
    let Ok(host) = host.to_str() else {
        return false;
    };
    let name = match host.rsplit_once(':') {
        // `[::1]:9980`, `127.0.0.1:9980`, `localhost:9980`; not the colons of a bare IPv6.
        Some((name, port)) if !name.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            if name.starts_with('[') || !name.contains(':') {
                name
            } else {
                host
            }
        }
        _ => host,
    };
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost") || bare.parse::<std::net::IpAddr>().is_ok()
}

/// `POST /debug/stall?ms=N`: only when the process was started with the stall hook, which
/// exists for the fault tests alone. Otherwise the route does not exist.
fn stall(state: &State, query: &str) -> Answer {
    if !state.stall_hook {
        return problem(StatusCode::NOT_FOUND, "NOT_FOUND", "no such admin route");
    }
    let ms = query
        .strip_prefix("ms=")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1000);
    // Answered at once, not when the owner takes it: the fault tests watch `/readyz`.
    drop(state.mutex.stall(Duration::from_millis(ms)));
    ok(json!({"stalled_ms": ms}))
}

async fn readyz(state: &State) -> Answer {
    match not_ready(state).await {
        None => ok(json!({"ready": true})),
        Some((reason, detail)) => problem_with(
            StatusCode::SERVICE_UNAVAILABLE,
            "NOT_READY",
            detail,
            Some(reason),
        ),
    }
}

/// Why the gateway should not be sent traffic, if it should not: `(reason, detail)`.
async fn not_ready(state: &State) -> Option<(&'static str, String)> {
    // Before `ready`: a stop clears it too, so the stop is told first.
    if state.stopping.load(Ordering::Acquire) {
        return Some((
            "stopping",
            "shutting down: in-flight requests are draining".into(),
        ));
    }
    if !state.ready.load(Ordering::Acquire) {
        // The first open failed (locked, corrupt, missing): the owner's reason says what to
        // mend, where "starting" would only say to wait. A probe is answered at once: an
        // owner still inside its first open is starting.
        let ping = tokio::time::timeout(STARTING_PING, state.mutex.ping()).await;
        let failed = ping.ok().and_then(Result::ok).and_then(|s| s.fail_closed);
        return Some(match failed {
            Some(u) => (u.reason(), u.to_string()),
            None => ("starting", "the mutex's database is not open yet".into()),
        });
    }
    match state.mutex.ping().await {
        Err(u) => Some((u.reason(), u.to_string())),
        Ok(s) => match s.refusing() {
            Some(u) if s.halted => Some((u.reason(), format!("{u}; the kill switch is on too"))),
            Some(u) => Some((u.reason(), u.to_string())),
            None if s.halted => Some(("halted", "the kill switch is on".into())),
            None => None,
        },
    }
}

fn metrics(state: &State) -> Answer {
    let body = state.metrics.render(state.mutex.shared());
    respond(StatusCode::OK, metrics::CONTENT_TYPE, body.into())
}

async fn status(state: &State) -> Answer {
    let shared = state.mutex.shared();
    // A ping that fails is itself the answer: the owner is stuck or gone. The published
    // atomics still say what it last knew.
    let (live_keys, halted, fail_closed) = match state.mutex.ping().await {
        Ok(s) => (s.live_keys, s.halted, s.refusing()),
        Err(u) => (
            shared.live_keys.load(Ordering::Relaxed),
            shared.halted.load(Ordering::Relaxed),
            Some(u),
        ),
    };
    ok(json!({
        "live_keys": live_keys,
        "halted": halted,
        "serving": fail_closed.is_none(),
        "fail_closed": fail_closed.as_ref().map(Unavailable::reason),
        "detail": fail_closed.as_ref().map(Unavailable::to_string),
        // As `/readyz` says it: a draining gateway takes no new trades.
        "ready": state.ready.load(Ordering::Acquire)
            && !state.stopping.load(Ordering::Acquire)
            && fail_closed.is_none()
            && !halted,
        "orders_in_flight": state.outstanding.count(),
        // A restart applies a change of executor: this is the one serving.
        "executor": state.executor,
        "restart_pending": state
            .restart_pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone(),
        "reload_refused": state
            .reload_refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone(),
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

async fn list(state: &State, query: &str) -> Answer {
    let limit = match parse_limit(query) {
        Ok(l) => l,
        Err(detail) => return problem(StatusCode::BAD_REQUEST, "INVALID_REQUEST", detail),
    };
    // One list made at a time: 10,000 entries and their answer take a few MB, and the
    // admin face's 32 connections asking at once would take that many times as much (a
    // poller on a Raspberry Pi). The semaphore is never closed: the wait ends in a turn.
    let _turn = LISTS.acquire().await;
    // One more than asked says whether there is more.
    match state.mutex.list(limit + 1).await {
        Ok(mut entries) => {
            let truncated = entries.len() > limit;
            entries.truncate(limit);
            // One wait for all of them: each key's may be a reserve's round trip.
            let asked: Vec<_> = entries.iter().map(EntryInfo::order).collect();
            let out = state.outstanding.orders_out(&asked).await;
            #[derive(serde::Serialize)]
            struct List<'a> {
                keys: Vec<EntryView<'a>>,
                truncated: bool,
            }
            let keys = entries.iter().zip(out).map(EntryView::of).collect();
            ok(List { keys, truncated })
        }
        Err(u) => unavailable(&u),
    }
}

/// `/keys` lists made at once: one (`list`).
static LISTS: Semaphore = Semaphore::const_new(1);

fn parse_limit(query: &str) -> Result<usize, String> {
    let mut limit = DEFAULT_LIMIT;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("limit", v)) => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| format!("limit must be 1 to {MAX_LIMIT}"))?;
            }
            _ => return Err(format!("unknown query parameter {pair:?}")),
        }
    }
    Ok(limit)
}

async fn show(state: &State, raw: &str) -> Answer {
    let key = match parse_key(raw) {
        Ok(k) => k,
        Err(a) => return *a,
    };
    match state.mutex.get(key).await {
        Ok(Some(e)) => ok(EntryView::of((&e, order_out(state, &e).await))),
        Ok(None) => not_found(),
        Err(u) => unavailable(&u),
    }
}

/// `POST /keys/{key}/release?entry=TAG[&force=1]`. A key whose order is at the executor now is not
/// released without `force`: its outcome is not known yet, and a retry let through now
/// could fill beside it (`executor::outstanding`).
async fn release(state: &State, raw: &str, query: &str) -> Answer {
    let key = match parse_key(raw) {
        Ok(k) => k,
        Err(a) => return *a,
    };
    let (force, entry) = match release_query(query) {
        Ok(q) => q,
        Err(detail) => return problem(StatusCode::BAD_REQUEST, "INVALID_REQUEST", detail),
    };
    // The release names the entry looked at here, in the state it is in: the owner
    // removes that entry only, and only if it has not settled since. An order is marked
    // outstanding before its reserve is sent and until its settling is queued, and bound
    // to the entry its reserve made, so an entry that is live now with no mark bound to it
    // once the marks taken before the look are bound or gone has no order out; an order
    // marked later cannot hold it (a reserve makes a new entry). `entry` pins the look
    // further back, to the operator's own (`keys show`): an entry that settled since (an
    // order out then, filled or timed out now), or a key freed and taken again, is not
    // the one they judged.
    let seen = match state.mutex.get(key.clone()).await {
        Ok(Some(e)) => e,
        Ok(None) => return not_found(),
        Err(u) => return unavailable(&u),
    };
    let out = order_out(state, &seen).await;
    if entry != entry_tag(&seen, out) {
        return key_changed();
    }
    if !force && out {
        return problem(
            StatusCode::CONFLICT,
            "ORDER_IN_FLIGHT",
            "the order that made this key's entry is at the executor now and may still \
             fill: wait for its outcome (keys show), or, if you know it cannot fill, \
             release with force and the entry keys show gives",
        );
    }
    match state
        .mutex
        .force_release(key.clone(), Some(Seen::from(&seen)))
        .await
    {
        Ok(Released::Yes) => {
            // The one record of an operator letting a retry through beside an order that
            // may fill: it says so, and names the entry they judged.
            if out {
                log::warn!(
                    "operator released key {key} by force (entry {entry}) while its order \
                     was at the executor: a retry may be placed beside it"
                );
            } else {
                log::warn!("operator released key {key} (entry {entry})");
            }
            ok(json!({"key": key.as_str(), "released": true, "in_flight": out}))
        }
        Ok(Released::NotFound) => not_found(),
        Ok(Released::Changed) => key_changed(),
        Err(u) => unavailable(&u),
    }
}

/// `entry=TAG` and maybe `force=1`, each at most once, in any order. The entry is required:
/// every live entry is one whose order may have filled (committed; or pending, its
/// outcome unknown, or its commit lost), so a release frees what the operator judged or
/// nothing. Without it, a look taken while the order was out, and a release sent once it
/// had filled or timed out, would free the fill to be placed again; and a forced release
/// of whatever holds the key now, a retry's new order that took it since.
fn release_query(query: &str) -> Result<(bool, &str), String> {
    let (mut force, mut entry) = (false, None);
    for part in query.split('&').filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            Some(("force", "1")) if !force => force = true,
            Some(("entry", tag)) if entry.is_none() => entry = Some(entry_tag_of(tag)?),
            _ => {
                return Err(format!(
                    "unknown query {query:?}: the parameters are force=1 and entry=TAG, \
                     once each"
                ));
            }
        }
    }
    let Some(entry) = entry else {
        return Err(
            "a release needs entry=TAG, the entry keys show gave: it frees the entry \
                    the operator judged, as it was then, or nothing (an order whose outcome \
                    is unknown may have filled: check the exchange first)"
                .into(),
        );
    };
    Ok((force, entry))
}

/// `tag` if it reads as an entry tag `keys show` gives (`entry_tag`: digits, lower-case hex
/// and dots), else why not. The command line checks `--entry` with it too, so that a tag
/// pasted wrong (empty, quoted, upper case) is its usage error, nothing sent.
pub fn entry_tag_of(tag: &str) -> Result<&str, String> {
    let fits = |c: char| c.is_ascii_digit() || c.is_ascii_lowercase() || c == '.';
    if tag.is_empty() || tag.len() > 64 || !tag.chars().all(fits) {
        return Err(format!(
            "entry {tag:?} is not an entry that keys show gives"
        ));
    }
    Ok(tag)
}

/// An entry as `keys show` names it: its number, when it was stored, its state (`out` for
/// a pending entry whose order is at the executor), and the load of the index it was seen
/// in. Any of them moving makes it another entry to an operator: a commit changes the
/// state; so does the end of an order whose commit was lost (refused while failing
/// closed, or by a failed write), which leaves a filled trade pending where the operator saw it
/// out; a retry that took the key anew has another time (after a restart, which may hand
/// out a released entry's number again, the number alone would not tell); and a reopen or
/// a restart may have lost a commit carried in memory, so that a filled trade reads as the
/// operator once saw it, but in another load.
fn entry_tag(e: &EntryInfo, out: bool) -> String {
    let word = match e.state {
        EntryState::Pending if out => "out",
        s => s.as_str(),
    };
    format!("{}.{}.{word}.{:08x}", e.seq, e.stored_at, e.load)
}

fn key_changed() -> Answer {
    problem(
        StatusCode::CONFLICT,
        "KEY_CHANGED",
        "the key changed since it was looked at: its order settled (a pending trade that \
         filled is committed now), a new order took it, or the database was reopened: look \
         again (keys show)",
    )
}

fn not_found() -> Answer {
    problem(StatusCode::NOT_FOUND, "KEY_NOT_FOUND", "no live entry")
}

async fn halt(state: &State, halted: bool) -> Answer {
    match state.mutex.set_halted(halted).await {
        Ok(()) => {
            log::warn!(
                "operator {} the kill switch",
                if halted { "set" } else { "lifted" }
            );
            ok(json!({"halted": halted}))
        }
        Err(u) => unavailable(&u),
    }
}

/// A path segment to a key: percent-decoded, then held to what the mutex could have stored.
fn parse_key(raw: &str) -> Result<Key, Box<Answer>> {
    client::decode_key(raw)
        .ok_or_else(|| "malformed percent-encoding".to_string())
        .and_then(|text| {
            Key::from_stored(&text).map_err(|e| match e {
                // Said of an operator's typing, not of a stored entry.
                KeyError::Stored => "not a key of a form the gateway stores: client:…, \
                                     trade:… or sig:… followed by 32 hex digits, as \
                                     `keys list` and the 409's key give them"
                    .to_string(),
                e => e.to_string(),
            })
        })
        .map_err(|detail| Box::new(problem(StatusCode::BAD_REQUEST, "INVALID_KEY", detail)))
}

/// Whether the order that made the entry `e` is at the executor now: for the guard of a
/// signed retry turned away, the order of the trade that turned it away, which settles it.
async fn order_out(state: &State, e: &EntryInfo) -> bool {
    let (key, seq) = e.order();
    state.outstanding.order_out(key, seq).await
}

/// An entry as `keys show` and `keys list` give it (`/keys/KEY`, `/keys`). Written to the
/// answer as it is, not through a `Value` tree: a list of 10,000 took ~30 MB at once that
/// way. Its members by name, as `json!` ordered them.
#[derive(serde::Serialize)]
struct EntryView<'a> {
    age_ms: u64,
    /// Which entry this is, in which state, for `keys release --entry`.
    entry: String,
    expires_at: u64,
    expires_in_ms: u64,
    has_response: bool,
    in_flight: bool,
    key: &'a str,
    /// As a duplicate's 409 says it: `unknown` is a pending entry with no order out.
    order: &'static str,
    state: &'static str,
    stored_at: u64,
}

impl<'a> EntryView<'a> {
    /// `e`, and whether its order is out.
    fn of((e, out): (&'a EntryInfo, bool)) -> Self {
        EntryView {
            age_ms: e.age_ms,
            entry: entry_tag(e, out),
            expires_at: e.expires_at,
            expires_in_ms: e.expires_in_ms,
            has_response: e.has_response,
            in_flight: out,
            key: e.key.as_str(),
            order: crate::gateway::problem::order_state(e.state, out),
            state: e.state.as_str(),
            stored_at: e.stored_at,
        }
    }
}

fn unavailable(u: &Unavailable) -> Answer {
    problem_with(
        StatusCode::SERVICE_UNAVAILABLE,
        "IDEMPOTENCY_UNAVAILABLE",
        u.to_string(),
        Some(u.reason()),
    )
}

fn not_allowed(allowed: &Method) -> Answer {
    let mut a = problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "METHOD_NOT_ALLOWED",
        format!("use {allowed}"),
    );
    let allow = match *allowed {
        Method::GET => "GET, HEAD",
        ref m => m.as_str(),
    };
    if let Ok(v) = HeaderValue::from_str(allow) {
        a.headers_mut().insert(header::ALLOW, v);
    }
    a
}

fn ok(v: impl serde::Serialize) -> Answer {
    match serde_json::to_vec(&v) {
        Ok(body) => respond(StatusCode::OK, "application/json", body.into()),
        // Not for these answers, whose maps all have string keys: said all the same.
        Err(e) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            format!("the answer could not be written: {e}"),
        ),
    }
}

/// A request on a connection past [`MAX_CONNECTIONS`]: answered, and not acted on.
fn busy_answer() -> Answer {
    let mut answer = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "ADMIN_BUSY",
        format!(
            "the admin face serves {MAX_CONNECTIONS} connections at once, and has as many \
             open: nothing was done; close the idle ones (a script's kept-alive \
             connections?) and run the command again"
        ),
    );
    answer
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    answer
}

/// An error answer: the same problem document, headers included, as the webhook's, so an
/// operator's tools read both faces alike.
fn problem(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Answer {
    problem_with(status, code, detail.into(), None)
}

/// A problem with a `reason` member: the stable label of why the mutex cannot serve.
fn problem_with(
    status: StatusCode,
    code: &'static str,
    detail: String,
    reason: Option<&'static str>,
) -> Answer {
    let mut doc = crate::gateway::problem::document(status, code, detail);
    if let Some(r) = reason {
        doc["reason"] = r.into();
    }
    crate::gateway::problem::respond(status, &doc)
}

/// `no-store` like the errors: keys, status and readiness change from one call to the next.
fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Answer {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket is private from its bind, whatever the umask: under `umask 000` it was made
    /// 0777 and chmodded only after, and another local user connected in between. In a
    /// child process, for the umask is the whole process's.
    #[test]
    fn the_socket_is_private_from_its_bind_under_any_umask() {
        const NAME: &str = "admin::tests::the_socket_is_private_from_its_bind_under_any_umask";
        const ROLE: &str = "HOOX_ADMIN_UMASK_DIR";
        if let Some(dir) = std::env::var_os(ROLE) {
            // SAFETY: swaps the mask; this child runs this test alone.
            unsafe { libc::umask(0) };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let path = Path::new(&dir).join("admin.sock");
            let _listener = rt.block_on(async { bind_private(&path) }).unwrap();
            let mode = std::fs::symlink_metadata(&path)
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "made {:o}", mode & 0o777);
            // SAFETY: as above.
            assert_eq!(unsafe { libc::umask(0) }, 0, "the umask was not put back");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let out = crate::testing::rerun(NAME)
            .unwrap()
            .env(ROLE, dir.path())
            .output()
            .unwrap();
        assert!(
            crate::testing::passed(&out),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(dir.path().join("admin.sock").exists());
    }

    #[test]
    fn only_loopback_or_a_socket_is_accepted() {
        assert_eq!(
            Listen::parse("127.0.0.1:9980"),
            Ok(Listen::Tcp("127.0.0.1:9980".parse().unwrap()))
        );
        assert!(matches!(Listen::parse("[::1]:9980"), Ok(Listen::Tcp(_))));
        // 127.0.0.1 written as IPv4-mapped IPv6 is loopback too.
        assert!(matches!(
            Listen::parse("[::ffff:127.0.0.1]:9980"),
            Ok(Listen::Tcp(_))
        ));
        assert_eq!(
            Listen::parse("unix:/run/hoox-edge/admin.sock"),
            Ok(Listen::Unix("/run/hoox-edge/admin.sock".into()))
        );
        for bad in ["0.0.0.0:9980", "192.168.1.2:9980", "[::]:9980"] {
            let e = Listen::parse(bad).unwrap_err();
            assert!(e.contains("not a loopback"), "{e}");
        }
        for bad in ["localhost:9980", "9980", "unix:", ""] {
            assert!(Listen::parse(bad).is_err(), "{bad}");
        }
        let shown = Listen::parse("unix:/tmp/a.sock").unwrap().to_string();
        assert_eq!(shown, "unix:/tmp/a.sock");
    }

    /// A socket file another process may still listen on is not replaced: only a refused
    /// connection says it was left behind. Here a live datagram socket (as systemd's
    /// notify socket), which a stream connect cannot reach; it was taken before. And a
    /// gateway that stops removes its socket only if the path still holds it.
    #[tokio::test]
    async fn a_socket_is_replaced_only_when_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.sock");
        let other = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let e = bind(&Listen::Unix(path.clone()))
            .await
            .err()
            .expect("refused");
        assert!(
            e.to_string().contains("may belong to a running process"),
            "{e}"
        );
        drop(other);
        // Left behind by a process that stopped (a bound, closed listener): replaced.
        drop(std::os::unix::net::UnixListener::bind(&path));
        assert!(path.exists());
        let bound = bind(&Listen::Unix(path.clone())).await.unwrap();
        // Another's, bound at the path since: still there after this one stops.
        std::fs::remove_file(&path).unwrap();
        let _theirs = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(bound);
        assert!(path.exists(), "another's socket removed");
        // Its own: removed at its stop.
        drop(_theirs);
        std::fs::remove_file(&path).unwrap();
        drop(bind(&Listen::Unix(path.clone())).await.unwrap());
        assert!(!path.exists());
    }

    #[test]
    fn limits_are_bounded() {
        assert_eq!(parse_limit(""), Ok(DEFAULT_LIMIT));
        assert_eq!(parse_limit("limit=5"), Ok(5));
        assert!(parse_limit("limit=0").is_err());
        assert!(parse_limit("limit=-1").is_err());
        assert!(parse_limit("limit=10001").is_err());
        assert!(parse_limit("lim").is_err());
    }
}
