//! The TLS face: the accept loop, connection limits and graceful shutdown. Knows nothing of
//! redb: every request goes to `webhook::handle`, which talks to the mutex by its handle.

pub mod auth;
pub mod idem;
pub mod idle;
pub mod limits;
pub mod problem;
pub mod tls;
pub mod trade;
pub mod webhook;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::platform::log::Throttled;
use limits::{Handshakes, PerIp, Stalled};
pub use webhook::{Gateway, Peer};

/// Requests in flight on one HTTP/2 connection.
const H2_STREAMS: u32 = 16;
/// The largest header block of an HTTP/2 request (a webhook's take a few hundred bytes).
const H2_HEADER_LIST: u32 = 8 * 1024;
/// The body data one HTTP/2 stream may send before the gateway reads it: the protocol's
/// default, which a client uses until it has the gateway's SETTINGS. A smaller one shrinks
/// the window of a stream that sent data before them, and h2 (0.4.20) then never sends
/// that stream a WINDOW_UPDATE: a body over 4 KiB sent at once on a fresh connection (as
/// Node's client sends it) waited for the body timeout and was refused.
const H2_STREAM_WINDOW: u32 = 65_535;
/// The body data an HTTP/2 connection may send before the gateway reads it: every stream's
/// window at once, so that the streams waiting their turn to be read
/// (`webhook::BODIES_AT_ONCE`) can never fill it between them and leave the bodies being
/// read no room to arrive, until the body timeout.
const H2_CONNECTION_WINDOW: u32 = H2_STREAMS * H2_STREAM_WINDOW;

/// How long in-flight requests may take to finish their commit or release at shutdown.
/// The packaged unit's `TimeoutStopSec=45s` leaves the rest for the close.
pub const DRAIN: Duration = Duration::from_secs(30);
/// Once the drain begins, how long a connection stays open (from the drain's start, and
/// then with nothing in flight): enough for HTTP/2's closing exchange (GOAWAY, PING, the
/// last GOAWAY) and for the last answer to be written (a request ends before hyper writes
/// its answer). One with a request head half sent, or a client that holds it open, held
/// the drain (and the restart, the listener closed) for a whole `header_timeout` more.
const DRAIN_LINGER: Duration = Duration::from_secs(1);
/// Warnings that can come in floods (connections refused over `max_connections_per_ip`,
/// failed handshakes) are logged at most this often, with how many since the last line: a
/// flood must not become a flood of log lines.
const FLOOD_LOG_EVERY: Duration = Duration::from_secs(60);

/// The accept loop's and the connections' warnings that can come in floods (a connection
/// flood, a scan, a sender that does not trust the certificate), each said at most once a
/// period with how many since (`Throttled`) and what the latest was. What a period held
/// back is said when the period ends, on the accept loop's tick, or at the stop: said only
/// with the next event, the last of a burst never was (200 refused, "closed 1").
#[derive(Clone)]
struct Floods(Arc<std::sync::Mutex<[(Throttled, String); Flood::ALL.len()]>>);

#[derive(Debug, Clone, Copy)]
enum Flood {
    /// A connection over its address's share, closed before its handshake.
    Refused,
    AcceptFailed,
    /// A client certificate that verified but names nobody: two such clients could not
    /// be told apart, so neither is served (the handshake succeeded, and only this says
    /// why every request then fails).
    Nameless,
    /// A connection closed in a handshake that had stalled, to give its place at the
    /// connection cap to one waiting (`limits::Handshakes`).
    Stalled,
    /// A handshake the TLS layer refused: plain HTTP on the TLS port, a sender that does
    /// not trust the gateway's certificate, a client certificate `client_ca` did not issue.
    /// A client that closes before its hello (a TCP health check) is not one.
    Handshake,
    /// A connection closed on the client's protocol error, where hyper or h2 answer before
    /// any request reaches `webhook::handle` and nothing else would say it: a malformed or
    /// oversized head (400, 431), an HTTP/2 flood or error answered with a GOAWAY (rapid
    /// reset, CONTINUATION). Not a head late (slowloris): hyper's header timer and the
    /// gateway's idle close (`idle.rs`) run out together on a kept-alive connection, and
    /// which one ends it is a race; every idle sender's connection would be warned of.
    Protocol,
}

impl Flood {
    const ALL: [Flood; 6] = [
        Flood::Refused,
        Flood::AcceptFailed,
        Flood::Nameless,
        Flood::Stalled,
        Flood::Handshake,
        Flood::Protocol,
    ];

    fn every(self) -> Duration {
        match self {
            Flood::AcceptFailed => crate::platform::log::REPEATED_EVERY,
            _ => FLOOD_LOG_EVERY,
        }
    }

    fn say(self, n: u64, latest: &str) {
        match self {
            Flood::Refused => log::warn!(
                "closed {n} connection(s) over their address's share, the latest from {latest}"
            ),
            Flood::AcceptFailed => {
                log::warn!("accept failed {n} time(s) since the last such warning: {latest}")
            }
            Flood::Nameless => log::warn!(
                "{n} connection(s) with a client certificate that names no one (no common \
                 name, and no DNS name, URI, email or IP address in its subjectAltName), the \
                 latest from {latest}: their requests are refused"
            ),
            Flood::Stalled => log::warn!(
                "at server.max_connections, closed {n} connection(s) whose TLS handshake \
                 had taken over {:?}, to take one waiting, the latest from {latest}",
                limits::STALLED_HANDSHAKE
            ),
            Flood::Handshake => log::warn!(
                "{n} TLS handshake(s) failed (plain HTTP on this port, a client that does not \
                 trust the certificate, or a client certificate server.client_ca does not \
                 verify), the latest from {latest}"
            ),
            Flood::Protocol => log::warn!(
                "closed {n} connection(s) on a protocol error (a malformed head or one over \
                 the header limit, an HTTP/2 flood or framing error), the latest from {latest}"
            ),
        }
    }
}

impl Floods {
    fn new() -> Floods {
        let each = Flood::ALL.map(|f| (Throttled::new(f.every()), String::new()));
        Floods(Arc::new(std::sync::Mutex::new(each)))
    }

    /// `what` happened; `latest` says which.
    fn happened(&self, what: Flood, latest: String) {
        // A poisoned lock holds counts only: still usable.
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (throttled, said) = &mut all[what as usize];
        *said = latest;
        if let Some(n) = throttled.say(Instant::now()) {
            what.say(n, said);
        }
    }

    /// Says what a period held back once it is over (`at_stop`: all of it, now).
    fn tick(&self, at_stop: bool) {
        let now = Instant::now();
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for (what, (throttled, latest)) in Flood::ALL.into_iter().zip(all.iter_mut()) {
            let held = if at_stop {
                throttled.rest()
            } else {
                throttled.due(now)
            };
            if let Some(n) = held {
                what.say(n, latest);
            }
        }
    }
}

/// What protocol error of the client's a connection ended on (`Flood::Protocol`), if it
/// was one rather than its client going away (a reset, a close mid-request, an HTTP/2
/// keep-alive ping unanswered, a head late): hyper's words, or h2's, which name the flood
/// (hyper's say only "http2 error").
fn protocol_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    crate::executor::http::causes(e)
        .find_map(|c| {
            if let Some(h) = c.downcast_ref::<hyper::Error>()
                && h.is_parse()
            {
                return Some(Some(h.to_string()));
            }
            let h2 = c.downcast_ref::<h2::Error>()?;
            let ours = h2.is_go_away() && h2.is_library();
            let refused = ours && h2.reason() != Some(h2::Reason::NO_ERROR);
            Some(refused.then(|| h2.to_string()))
        })
        .flatten()
}

/// Connection-level limits.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_connections: usize,
    /// Most connections one address may hold; one more is closed at once.
    pub max_connections_per_ip: usize,
    pub handshake_timeout: Duration,
    /// For the headers of a request, then for its body, and the longest a connection may
    /// have no request in flight (`idle.rs`).
    pub header_timeout: Duration,
}

/// The TLS configuration in force. SIGHUP swaps it; each new connection takes the current one,
/// and connections already open keep theirs, except that their client certificates are
/// checked again under the new one ([`ClientCheck`]).
pub type TlsConfig = Arc<Reloadable<tls::Tls>>;

/// A value SIGHUP replaces whole (the TLS configuration, the authenticator): each user takes
/// the current one and keeps it for as long as it needs it.
pub struct Reloadable<T>(RwLock<Arc<T>>);

impl<T> Reloadable<T> {
    pub fn new(value: Arc<T>) -> Self {
        Reloadable(RwLock::new(value))
    }

    // A poisoned lock means a thread panicked holding it; what it holds is an `Arc`,
    // swapped in one store, so it is whole either way, and still served.

    pub fn current(&self) -> Arc<T> {
        match self.0.read() {
            Ok(v) => v.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    pub fn replace(&self, value: Arc<T>) {
        match self.0.write() {
            Ok(mut v) => *v = value,
            Err(p) => *p.into_inner() = value,
        }
    }
}

/// A connection's client certificate, checked again under each TLS configuration a reload
/// brings, and once its first certificate's end date has passed: a client whose CA the
/// operator took out of `server.client_ca`, or whose certificate expired, must not keep
/// placing orders over a connection it opened before. Untrusted now, its requests are
/// refused (401), whatever other credential they carry: as a client without a
/// certificate, its trades would move to the shared secret's namespace, where a retry
/// is new. Checked once per configuration and once at the end date, not per request.
/// A connection made without a certificate is checked too, with an empty chain: trusted
/// until a reload adds `client_ca`.
struct ClientCheck {
    chain: Vec<CertificateDer<'static>>,
    /// Unix second after which a certificate of the chain that the handshake's path may
    /// hold has expired (`tls::valid_until`).
    until: i64,
    /// The configuration last checked under, and whether the chain verified in it.
    last: std::sync::Mutex<(Arc<tls::Tls>, bool)>,
    /// The peer as it is once untrusted: the same, without its certificate's name. Its
    /// own turns at reading bodies: a connection cut off between two requests may briefly
    /// read twice `BODIES_AT_ONCE`, once.
    untrusted: Arc<Peer>,
}

impl ClientCheck {
    fn new(
        chain: Vec<CertificateDer<'static>>,
        verified_under: Arc<tls::Tls>,
        handshake_began: i64,
        ip: std::net::IpAddr,
    ) -> Self {
        ClientCheck {
            // No certificate has no end date: checked again at a reload only.
            until: if chain.is_empty() {
                i64::MAX
            } else {
                tls::valid_until(&chain, handshake_began)
            },
            chain,
            last: std::sync::Mutex::new((verified_under, true)),
            untrusted: Arc::new(Peer::cut_off(ip)),
        }
    }

    /// The peer a request comes from under the configuration in force now.
    fn peer(&self, tls: &TlsConfig, verified: &Arc<Peer>) -> Arc<Peer> {
        let current = tls.current();
        // A poisoned lock holds a whole pair (assigned in one store): still the truth.
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let reloaded = !Arc::ptr_eq(&last.0, &current);
        // Past its end date, a chain still trusted is verified at each request until the
        // verifier agrees (within the second, its clock and this one may differ).
        let past_end = last.1 && crate::mutex::clock::unix_s() > self.until;
        if reloaded || past_end {
            let trusted = current.still_trusts(&self.chain);
            if last.1 && !trusted {
                match &verified.client_name {
                    Some(name) => log::warn!(
                        "client certificate {name:?} from {} no longer verifies {}: its \
                         connection's requests are refused",
                        verified.ip,
                        if reloaded {
                            "after a reload"
                        } else {
                            "(it expired)"
                        }
                    ),
                    None => log::warn!(
                        "connection from {} made without a client certificate, which \
                         server.client_ca asks for since a reload: its requests are refused",
                        verified.ip
                    ),
                }
            }
            *last = (current, trusted);
        }
        if last.1 {
            verified.clone()
        } else {
            self.untrusted.clone()
        }
    }
}

/// How many connections the addresses `limits.allow_ips` leaves out hold at once, all of
/// them together, apart from `server.max_connections`: each is answered 403 (SPEC's
/// `IP_FORBIDDEN`), which takes a handshake and a request, so a few are kept to say it;
/// beyond them such a connection is closed before its handshake.
const OUTSIDE_CONNECTIONS: usize = 16;

/// Accepts connections until `shutdown` resolves, then stops accepting and lets in-flight
/// requests finish (up to [`DRAIN`]).
pub async fn serve(
    listener: TcpListener,
    tls: TlsConfig,
    gw: Arc<Gateway>,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) {
    // Every connection's task, which the drain waits for.
    let connections = TaskTracker::new();
    // Cancelled when the drain begins: a connection still in its TLS handshake has no
    // request to finish, and would hold the drain for up to `handshake_timeout` (a port
    // scan, a TCP health check), with the listener already closed.
    let draining = CancellationToken::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    // The addresses limits.allow_ips leaves out share these, and hold none of `slots`.
    let outside = Arc::new(Semaphore::new(OUTSIDE_CONNECTIONS));
    let floods = Floods::new();
    let mut tick = tokio::time::interval(crate::platform::log::REPEATED_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let per_ip = PerIp::new(limits.max_connections_per_ip);
    let handshakes = Arc::new(Handshakes::default());
    let mut accepted: u64 = 0;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A client that never finishes its headers is dropped (slowloris).
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    // What one HTTP/2 connection can make the gateway hold, before anyone is authenticated:
    // its streams' headers (16 × 8 KiB), the body data its streams sent (its window,
    // 16 × 64 KiB), and the bodies being read (4 × 64 KiB, which frees their window):
    // ~1.4 MiB of request data (~1.7 MiB of memory measured, with TLS and HTTP/2 state),
    // against ~17 MiB with hyper's defaults (256 streams, each body read at once, 1 MiB
    // windows); over HTTP/1.1, hyper's read buffer stops growing past ~408 KiB, checked
    // between reads, so one last read can take it to ~816 KiB (1.12). A body is
    // copied as it is read (`webhook::read_body`), so tiny frames add nothing to it.
    // `server.max_connections` times that bounds them all.
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_STREAMS)
        .max_header_list_size(H2_HEADER_LIST)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .keep_alive_interval(Some(Duration::from_secs(30)));
    // The protocol is the one TLS negotiated (ALPN, SPEC §3), not one sniffed from the
    // first bytes: `h2` is served as HTTP/2 only, anything else (`http/1.1`, or no ALPN)
    // as HTTP/1.1 only, and a client that sends the other is refused as malformed.
    let builders = Arc::new((builder.clone().http1_only(), builder.http2_only()));
    tokio::pin!(shutdown);

    'accept: loop {
        let (tcp, addr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    floods.happened(Flood::AcceptFailed, e.to_string());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = tick.tick() => {
                floods.tick(false);
                continue;
            }
            _ = &mut shutdown => break,
        };
        let ip = addr.ip().to_canonical();
        let allowed = gw.allowlist.allows(ip);
        let refused = |over: String| {
            gw.metrics.connection_refused();
            floods.happened(Flood::Refused, format!("{ip} (over {over})"));
        };
        // Over its share: closed at once, before the handshake, whether or not places are
        // left (at the cap it blocked the loop, the signal engine's connection behind it).
        let Some(ip_slot) = per_ip.acquire(ip, allowed) else {
            // The limit it met: an address limits.allow_ips leaves out is held to one
            // connection, whatever max_connections_per_ip says.
            refused(if allowed {
                let most = limits.max_connections_per_ip;
                format!("server.max_connections_per_ip = {most}")
            } else {
                "one connection for an address outside limits.allow_ips".into()
            });
            continue;
        };
        // At the connection cap, an address the list names waits for a place, and the
        // kernel's backlog holds the rest. A place comes back when a connection ends, or,
        // for this one waiting, from the oldest handshake that has stalled
        // (`limits::Handshakes`). After a close, it looks again shortly: the handshake
        // closed may have ended just before, and be served, its place kept.
        // An address the list leaves out is answered 403 whatever it sends: it takes one
        // of the few places that such addresses share, apart from the cap (one of the
        // cap's each, a host with many addresses, an IPv6 /64, held every place, and the
        // sender the list names got no answer).
        let permit = if allowed {
            loop {
                let wait = match slots.clone().try_acquire_owned() {
                    Ok(p) => break p,
                    Err(_) => match handshakes.close_stalled() {
                        Stalled::In(left) => Some(left),
                        Stalled::Closed => Some(Duration::from_millis(500)),
                        Stalled::None => None,
                    },
                };
                tokio::select! {
                    p = slots.clone().acquire_owned() => match p {
                        Ok(p) => break p,
                        Err(_) => break 'accept, // the semaphore is never closed
                    },
                    _ = tokio::time::sleep(wait.unwrap_or(Duration::MAX)), if wait.is_some() => {}
                    _ = &mut shutdown => break 'accept,
                }
            }
        } else {
            match outside.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    refused(format!(
                        "{OUTSIDE_CONNECTIONS} connections for the addresses outside \
                         limits.allow_ips"
                    ));
                    continue;
                }
            }
        };
        let _ = tcp.set_nodelay(true);
        // Ended by the drain, or, stalled at the cap, to give its place up: of those
        // places only (the addresses outside the allowlist share their own).
        let stop = draining.child_token();
        accepted += 1;
        let in_handshake = allowed.then(|| handshakes.enter(accepted, stop.clone()));
        let accepted_under = tls.current();
        let acceptor = TlsAcceptor::from(accepted_under.config.clone());
        let tls = tls.clone();
        let gw = gw.clone();
        let builders = builders.clone();
        let draining = draining.clone();
        let floods = floods.clone();
        connections.spawn(async move {
            let _permit = permit;
            let _ip_slot = ip_slot;
            // Before the verifier's clock reading: a certificate ended by then was not on
            // the path it accepted (`tls::valid_until`).
            let handshake_began = crate::mutex::clock::unix_s();
            let handshake = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp));
            let done = stop.run_until_cancelled(handshake).await;
            drop(in_handshake);
            let stream = match done {
                Some(Ok(Ok(s))) => s,
                // Plaintext on the TLS port, a bad handshake, or a silent client.
                Some(Ok(Err(e))) => {
                    // The TLS layer's refusals are InvalidData; a close before the hello
                    // (a TCP health check) or a reset is the client going away.
                    if e.kind() == std::io::ErrorKind::InvalidData {
                        floods.happened(Flood::Handshake, format!("{ip}: {e}"));
                    } else {
                        log::debug!("TLS handshake from {addr} failed: {e}");
                    }
                    return;
                }
                // Stalled at the cap, and closed for one waiting; or the drain began.
                None if !draining.is_cancelled() => {
                    gw.metrics.connection_refused();
                    floods.happened(Flood::Stalled, ip.to_string());
                    return;
                }
                Some(Err(_)) | None => return,
            };
            let chain = stream.get_ref().1.peer_certificates();
            let client_name = chain.and_then(|c| c.first()).and_then(tls::client_name);
            let (check, peer) = match (client_name, chain) {
                (Some(name), Some(chain)) => (
                    Some(ClientCheck::new(
                        chain.to_vec(),
                        accepted_under,
                        handshake_began,
                        ip,
                    )),
                    Peer::new(ip, Some(name)),
                ),
                (None, Some(_)) => {
                    floods.happened(Flood::Nameless, ip.to_string());
                    (None, Peer::cut_off(ip))
                }
                // Checked too: a reload that adds `client_ca` cuts it off. Going on as
                // `psk` while its sender's new connections must be `cert.NAME` would
                // keep a sender the operator now asks a certificate of placing orders.
                (_, None) => (
                    Some(ClientCheck::new(
                        Vec::new(),
                        accepted_under,
                        handshake_began,
                        ip,
                    )),
                    Peer::new(ip, None),
                ),
            };
            let peer = Arc::new(peer);
            let activity = Arc::new(idle::Activity::new());
            let busy = activity.clone();
            // Cancelled by the first request of a client certificate not served, which is
            // refused (401, or what a malformed request gets first): the connection is then
            // closed, so that its sender opens a new one (with a certificate that verifies
            // now) rather than be refused on a kept-alive connection as long as it sends.
            let cut = CancellationToken::new();
            let cut_by = cut.clone();
            let svc = service_fn(move |req| {
                let request = busy.begin();
                let in_flight = gw.in_flight.token();
                let peer = match &check {
                    Some(check) => check.peer(&tls, &peer),
                    None => peer.clone(),
                };
                // Said in its answer over HTTP/1.1 (HTTP/2 has the GOAWAY): a client that
                // kept the connection would race the close with its next request.
                let close = peer.cut_off && req.version() < hyper::Version::HTTP_2;
                if peer.cut_off {
                    cut_by.cancel();
                }
                let answer = webhook::handle(gw.clone(), peer, req);
                async move {
                    let mut r = answer.await;
                    drop((request, in_flight));
                    if let Ok(answer) = &mut r
                        && close
                    {
                        let value = hyper::header::HeaderValue::from_static("close");
                        answer
                            .headers_mut()
                            .insert(hyper::header::CONNECTION, value);
                    }
                    r
                }
            });
            let (http1, http2) = &*builders;
            let builder = match stream.get_ref().1.alpn_protocol() {
                Some(b"h2") => http2,
                _ => http1,
            };
            let conn = builder
                .serve_connection(TokioIo::new(stream), svc)
                .into_owned();
            tokio::pin!(conn);
            // Idle, or at shutdown, a connection is closed gracefully: over HTTP/2 with a
            // GOAWAY that tells the client which of its streams were not taken, so that a
            // request sent as the close began is answered, or known unsent and safe to
            // send again, never lost in a dropped connection. A client that keeps it open
            // after that is dropped once a whole `header_timeout` has passed and then as
            // long again with nothing in flight: the last answer has had that long to be
            // written (a request ends before hyper writes its answer).
            let t = limits.header_timeout;
            let linger = async {
                tokio::time::sleep(t).await;
                activity.idle_for(t).await;
            };
            tokio::pin!(linger);
            // At the drain, shorter: a second from the drain's start, and a second with
            // nothing in flight (a request in flight is served, its answer written). From
            // the start, not from the last request's end: an HTTP/2 connection idle for
            // longer was dropped at once, under its GOAWAY's exchange, and a request sent
            // as the GOAWAY came was lost rather than answered or refused unprocessed.
            let drained = async {
                draining.cancelled().await;
                let linger = DRAIN_LINGER.min(t);
                tokio::time::sleep(linger).await;
                activity.idle_for(linger).await;
            };
            tokio::pin!(drained);
            // A cut connection goes away once nothing is in flight on it, not as the
            // request that cut it comes in: hyper's HTTP/2 client (the one in reqwest) can
            // drop a request it has begun to send, unanswered, when a GOAWAY comes just
            // then (hyperium/hyper#2500; seen here with the body still to send). By then
            // every request on it has its answer, and the gateway answers once it has read
            // the body (bar the few it refuses unread). At most `header_timeout` after the
            // cut, though: a sender whose requests always overlap would keep it open.
            let cut_and_quiet = async {
                cut.cancelled().await;
                let _ = tokio::time::timeout(t, activity.quiet()).await;
            };
            tokio::pin!(cut_and_quiet);
            let mut closing = false;
            loop {
                // The connection first: a request already read is served before any close.
                tokio::select! {
                    biased;
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            match protocol_error(&*e) {
                                Some(what) => {
                                    floods.happened(Flood::Protocol, format!("{ip}: {what}"));
                                }
                                None => log::debug!("connection from {addr} ended: {e}"),
                            }
                        }
                        break;
                    }
                    () = activity.idle_for(t), if !closing => {
                        log::debug!("closing idle connection from {addr}");
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    () = draining.cancelled(), if !closing => {
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    () = &mut cut_and_quiet, if !closing => {
                        log::debug!(
                            "closing the connection from {addr}: its client certificate is \
                             not served"
                        );
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    () = &mut linger, if closing => break,
                    () = &mut drained, if closing => break,
                }
            }
        });
    }
    drop(listener);
    draining.cancel();
    // From here no order starts that could not end within the drain (`webhook::handle`).
    let _ = gw.drain_end.set(Instant::now() + DRAIN);
    // Connections, and requests and orders whose client hung up, which no connection waits
    // for: all settle their keys before the caller stops the mutex's owner.
    let drained = async {
        connections.close();
        connections.wait().await;
        gw.in_flight.close();
        gw.in_flight.wait().await;
    };
    tokio::select! {
        () = drained => {}
        _ = tokio::time::sleep(DRAIN) => log::warn!("in-flight requests did not finish in {DRAIN:?}"),
    }
    // After the drain: a connection may end on a protocol error during it.
    floods.tick(true);
}

/// Binds the webhook listener; port 0 picks a free port (tests).
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr).await?;
    let local = l.local_addr()?;
    Ok((l, local))
}
