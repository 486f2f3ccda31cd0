//! `hoox-load run`: N TLS connections sending HOOX-shaped trades, closed loop (each connection
//! sends its next request the moment the last one is answered) or open loop (`--rate`: requests
//! are due on a fixed schedule, and latency counts from when a request was due, not when it
//! was sent, so neither a stalled server nor a late generator can hide a stall by slowing the
//! client down).
//!
//! No tokio timer stands between two requests: tokio's timer wheel ticks every millisecond and
//! rounds a deadline up to the next tick, which would add up to 1 ms to every request and
//! measure the generator, not the server. Open loop is paced by one OS thread sleeping with
//! `std::thread::sleep` (an hrtimer), which releases each request at its due time; any free
//! connection takes it. Latency counts from the due time, so how late the pacer woke (the
//! platform's timer precision: on a small VM p50 ~20 µs, p99 ~150 µs, rarely 1 ms; far more
//! when the box is overloaded) is inside it, as is waiting for a free connection: dropping
//! either would drop the wait of every request due meanwhile (coordinated omission). The
//! pacer's lateness is also reported apart, to show how much of a tail is the generator's.
//!
//! Throughput counts served answers only (2xx, and 409 in a run that may repeat a trade: a
//! repeat refused as a duplicate is the gateway working): a gateway that answers 401 or
//! 503 fast is not fast, nor one that answers 409 to fresh trades (`Plan::served`).

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hdrhistogram::Histogram;
use hmac::{KeyInit, Mac};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::TlsConnector;

use crate::{Error, ledger};

#[derive(clap::Args)]
pub struct Args {
    /// Webhook URL, e.g. https://127.0.0.1:8443/webhook
    #[arg(long)]
    url: String,
    /// PEM file of the certificate(s) to trust (the gateway's self-signed cert).
    #[arg(long)]
    ca: PathBuf,
    /// TLS server name to verify, if not the URL's host.
    #[arg(long)]
    server_name: Option<String>,
    #[arg(long, short = 'c', default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    connections: u32,
    /// Use HTTP/2 (one request in flight per connection).
    #[arg(long, conflicts_with = "http1")]
    http2: bool,
    /// Use HTTP/1.1 keep-alive (the default).
    #[arg(long)]
    http1: bool,
    /// How long to send, e.g. 10s (default 10s unless --requests is given).
    #[arg(long, value_parser = parse_span, conflicts_with = "requests")]
    duration: Option<Duration>,
    /// Send exactly this many requests.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    requests: Option<u64>,
    /// Open loop at this rate, e.g. 1000/s; latency counts from each request's scheduled time.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<f64>,
    /// Share of requests that repeat an earlier key (same trade), 0.0..=1.0.
    #[arg(long, default_value_t = 0.0, value_parser = parse_ratio)]
    dup_ratio: f64,
    /// Draw every key from this many (a storm: many connections, few keys); overrides --dup-ratio.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    keys: Option<u64>,
    /// Key prefix; runs that share it share keys (the chaos test retries across restarts).
    #[arg(long)]
    key_prefix: Option<String>,
    /// How to authenticate; the secret is read from --secret-file, never from the command line.
    #[arg(long, value_enum, requires = "secret_file")]
    auth: Option<AuthKind>,
    /// Secrets file, read as the gateway reads its own (one per line, blank lines and `#`
    /// comments skipped, not readable by everyone); the first secret is used.
    #[arg(long, requires = "auth")]
    secret_file: Option<PathBuf>,
    /// Per-request timeout.
    #[arg(long, value_parser = parse_span, default_value = "10s")]
    timeout: Duration,
    /// Ledger to check at the end (http://HOST:PORT/ledger); exit 1 if a key was forwarded
    /// twice. Its verdict covers every order the ledger has taken since it started, this
    /// run's and earlier ones', and cannot tell a double from a key sent again after its
    /// TTL, which the gateway rightly forwards again: give runs with repeats a `store.ttl`
    /// longer than the run. It is asked once before the run too, so that a wrong URL costs
    /// no run.
    #[arg(long)]
    ledger: Option<String>,
    /// Machine-readable output: one JSON object for the run, and with --ledger a second line,
    /// the ledger's verdict.
    #[arg(long)]
    json: bool,
    /// Exit 0 even if some answers are not served (2xx, or 409 in a run that may repeat a
    /// trade), or some requests fail in transport
    /// (the chaos bench kills the gateway on purpose); without it, such a run exits 4.
    /// Exits 1 (the ledger), 5 (a replayed key forwarded again) and 6 (a replayed key not
    /// shown held) still apply.
    #[arg(long)]
    expect_errors: bool,
    /// Append the key of every request answered 2xx to this file, one per line: the keys
    /// only, nothing secret (not a stored answer a replay-mode gateway gave a duplicate,
    /// marked Idempotent-Replayed). What a later --replay-keys sends again.
    #[arg(long)]
    write_2xx_keys: Option<PathBuf>,
    /// Send each key in this file (one per line, as --write-2xx-keys writes them) once, with
    /// the very trade the key first carried, so the gateway must answer 409 to each (or,
    /// in replay mode, its stored answer, marked Idempotent-Replayed): any other 2xx is
    /// that trade forwarded again, and the run exits 5; any other answer, or none, leaves
    /// the key not shown held, and the run exits 6. The keys carry their own prefix:
    /// --key-prefix is not used.
    #[arg(long, conflicts_with_all = ["duration", "requests", "keys", "dup_ratio"])]
    replay_keys: Option<PathBuf>,
    /// Trades without an idempotencyKey, each told apart by its fingerprint alone (SPEC
    /// §2), as a sender that sends no key is: a repeat (--dup-ratio, --keys) is a duplicate
    /// within 60 s of the trade's first reserve, whatever its minute, and a new trade after
    /// that (--ledger counts it so). The trades' exchange is the key prefix (at most 32
    /// characters), their symbol their number.
    #[arg(long, conflicts_with_all = ["replay_keys", "write_2xx_keys"])]
    keyless: bool,
}

/// The exit code of a run in which an answer was not served (`Plan::served`), or a request
/// failed in transport (and --expect-errors was not given).
const EXIT_ERRORS: u8 = 4;

/// The exit code of a --replay-keys run in which a replayed key was answered 2xx: the
/// gateway forwarded a trade it had already answered 2xx for.
const EXIT_REPLAY_FORWARDED: u8 = 5;

/// The exit code of a --replay-keys run in which a replayed key was not shown held: its
/// answer was neither 409 nor its stored answer (a 503, a 422 for another trade, none at
/// all). A replay is the check that every key is still held, so --expect-errors does not
/// excuse it: a gateway halted, or down, proves nothing.
const EXIT_REPLAY_UNPROVEN: u8 = 6;

/// Keys go into JSON and headers unescaped, and are at most 255 characters.
fn valid_prefix(p: &str) -> bool {
    p.len() <= 200
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

/// The keys in a --write-2xx-keys file, each split into its prefix and its number (which
/// fixes the trade, see `Plan::body`).
fn read_replay(path: &std::path::Path) -> Result<Vec<(String, u64)>, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let key = line
            .rsplit_once('-')
            .and_then(|(p, j)| Some((p, j.parse::<u64>().ok()?)))
            .filter(|(p, _)| valid_prefix(p));
        match key {
            Some((p, j)) => keys.push((p.to_string(), j)),
            None => {
                return Err(format!(
                    "{}:{}: not a key as --write-2xx-keys writes them",
                    path.display(),
                    n + 1
                )
                .into());
            }
        }
    }
    if keys.is_empty() {
        return Err(format!("{}: no keys", path.display()).into());
    }
    Ok(keys)
}

#[derive(clap::ValueEnum, Clone, Copy)]
enum AuthKind {
    Bearer,
    Apikey,
    Hmac,
}

/// A rate in requests per second, from one every 100 s to ten million a second: below, a
/// run would sit silent for hours; the schedule's arithmetic holds within.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let n = s.strip_suffix("/s").unwrap_or(s);
    match n.parse::<f64>() {
        Ok(r) if (0.01..=1e7).contains(&r) => Ok(r),
        _ => Err(format!(
            "rate must be a number per second from 0.01 to 10000000, like 1000/s: {s}"
        )),
    }
}

/// A span of time, more than none: a run of 0 s sent nothing and said nothing, and a
/// timeout of 0 s failed requests at random.
fn parse_span(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d > Duration::ZERO => Ok(d),
        Ok(_) => Err(format!("must be more than 0, like 10s: {s}")),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("ratio must be within 0.0..=1.0: {s}")),
    }
}

/// The credential, ready to attach. Debug is not derived: it holds a secret.
enum Auth {
    None,
    Bearer(hyper::header::HeaderValue),
    /// The JSON-encoded secret, spliced into the body as `apiKey`.
    ApiKey(String),
    Hmac(Vec<u8>),
}

impl Auth {
    fn load(kind: Option<AuthKind>, file: Option<&PathBuf>) -> Result<Auth, Error> {
        let (Some(kind), Some(file)) = (kind, file) else {
            return Ok(Auth::None);
        };
        // The gateway's own parser, so that any file the gateway accepts works here alike
        // (comments, blank lines, several secrets during a rotation). Its errors name the
        // file, never its content.
        let secrets = hoox_edge::secrets::load_secrets(file)?;
        // The gateway accepts any of its secrets; the first one listed will do.
        let secret = secrets
            .first()
            .ok_or_else(|| format!("{}: no secret", file.display()))?
            .expose();
        Ok(match kind {
            AuthKind::Bearer => {
                let mut value =
                    hyper::header::HeaderValue::from_bytes(&[b"Bearer ", secret].concat())
                        .map_err(|_| {
                            format!("{}: secret is not a valid header value", file.display())
                        })?;
                value.set_sensitive(true);
                Auth::Bearer(value)
            }
            AuthKind::Apikey => {
                let secret = std::str::from_utf8(secret)
                    .map_err(|_| format!("{}: secret is not UTF-8", file.display()))?;
                Auth::ApiKey(serde_json::to_string(secret)?)
            }
            AuthKind::Hmac => Auth::Hmac(secret.to_vec()),
        })
    }
}

/// Where and how to connect; shared by every connection.
struct Target {
    uri: Uri,
    /// What goes on the request line or in `:path`: relative for HTTP/1.1, absolute for h2.
    request_uri: Uri,
    authority: String,
    addr: String,
    server_name: ServerName<'static>,
    tls: TlsConnector,
    http2: bool,
}

impl Target {
    fn new(args: &Args) -> Result<Target, Error> {
        let uri: Uri = args.url.parse()?;
        if uri.scheme_str() != Some("https") {
            return Err(format!("URL must be https://: {}", args.url).into());
        }
        let authority = uri.authority().ok_or("URL has no host")?.clone();
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let addr = format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(443)
        );
        let name = args.server_name.clone().unwrap_or(host);
        let server_name = ServerName::try_from(name.clone())
            .map_err(|_| format!("bad TLS server name: {name}"))?;

        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&args.ca)
            .map_err(|e| format!("{}: {e}", args.ca.display()))?
        {
            roots.add(cert.map_err(|e| format!("{}: {e}", args.ca.display()))?)?;
        }
        if roots.is_empty() {
            return Err(format!("{}: no certificate in it (--ca)", args.ca.display()).into());
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![if args.http2 {
            b"h2".to_vec()
        } else {
            b"http/1.1".to_vec()
        }];

        let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let request_uri = if args.http2 {
            uri.clone()
        } else {
            path.parse()?
        };
        Ok(Target {
            uri,
            request_uri,
            authority: authority.to_string(),
            addr,
            server_name,
            tls: TlsConnector::from(Arc::new(config)),
            http2: args.http2,
        })
    }

    async fn connect(&self) -> Result<Conn, Error> {
        let tcp = TcpStream::connect(&self.addr).await?;
        tcp.set_nodelay(true)?;
        let tls = self.tls.connect(self.server_name.clone(), tcp).await?;
        let io = TokioIo::new(tls);
        // The connection futures end when the peer goes away; their errors surface on send.
        if self.http2 {
            let (sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(conn);
            Ok(Conn::H2(sender))
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(io).await?;
            tokio::spawn(conn);
            Ok(Conn::H1(sender))
        }
    }
}

enum Conn {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// Why an exchange failed: `Unsent` carries back a request the connection never wrote (it
/// had closed: the gateway's idle timeout, a GOAWAY), which may be sent again elsewhere.
enum SendError {
    Unsent(Box<Request<Full<Bytes>>>),
    /// Failed after it was written, or the connection broke: counted, not sent again.
    Failed,
    /// The new connection for an unsent request could not be made.
    Connect,
}

impl From<hyper::Error> for SendError {
    fn from(_: hyper::Error) -> Self {
        SendError::Failed
    }
}

impl Conn {
    /// Whether the server has closed this connection (or it broke): the gateway closes one
    /// left idle past its `header_timeout`, which a slow open loop over many connections
    /// does to each of them.
    fn is_closed(&self) -> bool {
        match self {
            Conn::H1(s) => s.is_closed(),
            Conn::H2(s) => s.is_closed(),
        }
    }

    async fn send(&mut self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, SendError> {
        let sent = match self {
            Conn::H1(s) => s.try_send_request(req).await,
            Conn::H2(s) => s.try_send_request(req).await,
        };
        sent.map_err(|mut e| match e.take_message() {
            Some(req) => SendError::Unsent(Box::new(req)),
            None => SendError::Failed,
        })
    }
}

/// 1 µs .. 60 s at 3 significant figures: a few hundred KiB each.
fn histogram() -> Result<Histogram<u64>, Error> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

/// What one connection measured; merged at the end.
struct Stats {
    latency_us: Histogram<u64>,
    /// Open loop only: how long after its due time each request went out. Includes waiting for
    /// a free connection, so it grows when the server falls behind, not only when we do.
    send_late_us: Histogram<u64>,
    status: BTreeMap<u16, u64>,
    errors: BTreeMap<&'static str, u64>,
    /// Answers received within the run's window, all of them and the served ones: what the
    /// throughput divides by the window (see `run`).
    answers_in_window: u64,
    served_in_window: u64,
    /// With --write-2xx-keys: the key numbers answered 2xx.
    ok_keys: Vec<u64>,
    /// 2xx answers to duplicates, from a gateway whose `duplicate_response` is "replay"
    /// (`Idempotent-Replayed: true`): the stored answer, nothing forwarded.
    replayed: u64,
}

impl Stats {
    fn new() -> Result<Stats, Error> {
        Ok(Stats {
            latency_us: histogram()?,
            send_late_us: histogram()?,
            status: BTreeMap::new(),
            errors: BTreeMap::new(),
            answers_in_window: 0,
            served_in_window: 0,
            ok_keys: Vec::new(),
            replayed: 0,
        })
    }

    fn error(&mut self, kind: &'static str) {
        *self.errors.entry(kind).or_insert(0) += 1;
    }

    fn merge(&mut self, other: Stats) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
        let _ = self.send_late_us.add(&other.send_late_us);
        for (k, v) in other.status {
            *self.status.entry(k).or_insert(0) += v;
        }
        for (k, v) in other.errors {
            *self.errors.entry(k).or_insert(0) += v;
        }
        self.answers_in_window += other.answers_in_window;
        self.served_in_window += other.served_in_window;
        self.ok_keys.extend(other.ok_keys);
        self.replayed += other.replayed;
    }
}

/// A small xorshift generator: picking keys to repeat needs speed, not secrecy.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// `X-Hoox-Signature`: `sha256=` and the hex HMAC-SHA256 of `"{timestamp}.{raw body}"`.
fn sign(secret: &[u8], ts: u64, body: &[u8]) -> Result<String, Error> {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret)?;
    mac.update(format!("{ts}.").as_bytes());
    mac.update(body);
    Ok(format!(
        "sha256={}",
        hex::encode(mac.finalize().into_bytes())
    ))
}

/// Everything the connections share while the run lasts.
struct Plan {
    target: Target,
    auth: Auth,
    key_prefix: String,
    next: AtomicU64,
    /// Keys issued so far: key numbers 0..fresh. A repeat draws from these, so a run of N
    /// fresh keys is exactly keys 0..N, and a later run with the same prefix replays them.
    fresh: AtomicU64,
    limit: Option<u64>,
    start: Instant,
    deadline: Option<Instant>,
    rate: Option<f64>,
    /// Open loop: the requests the pacer thread has released.
    paced: Option<Paced>,
    dup_ratio: f64,
    keys: Option<u64>,
    timeout: Duration,
    /// With --replay-keys: the keys to send, by key number (prefix, number).
    replay: Option<Vec<(String, u64)>>,
    /// With --write-2xx-keys: collect the keys answered 2xx.
    record_ok_keys: bool,
    /// With --keyless: trades without a key.
    keyless: bool,
    /// Whether the run may send a trade the gateway has seen: it repeats keys (--dup-ratio,
    /// --keys), replays them (--replay-keys), or shares them with other runs (--key-prefix).
    /// Else every key is this run's own (`load-` and a random number).
    repeats: bool,
}

impl Plan {
    /// An answer of a working gateway: 2xx, or 409 for a repeated trade when the run may
    /// repeat trades (`repeats`). Anything else is not throughput: a 409 in a run of fresh
    /// keys is a gateway that took new trades for duplicates, and its fast answers would
    /// lift bench.sh's ratios.
    fn served(&self, status: u16) -> bool {
        (200..300).contains(&status) || (status == 409 && self.repeats)
    }

    /// Key number `j` as a prefix and the number its trade is made from: ours, or with
    /// --replay-keys the `j`th key of the file.
    fn key(&self, j: u64) -> (&str, u64) {
        let replayed = self.replay.as_ref().and_then(|keys| keys.get(j as usize));
        match replayed {
            Some((prefix, n)) => (prefix, *n),
            None => (&self.key_prefix, j),
        }
    }

    /// The `Idempotency-Key` of key number `j`.
    fn key_string(&self, j: u64) -> String {
        let (prefix, n) = self.key(j);
        format!("{prefix}-{n}")
    }

    /// The trade for key number `j`: a repeated key carries the very same trade, so the gateway
    /// sees a duplicate (409) rather than a reused key with a different trade (422). The trade
    /// depends only on the key, so a replay from a file of keys repeats it too.
    fn body(&self, j: u64) -> String {
        let (prefix, j) = self.key(j);
        let milli = 1 + j % 1000;
        let action = if j.is_multiple_of(2) { "LONG" } else { "SHORT" };
        let api_key = match &self.auth {
            Auth::ApiKey(json) => format!(",\"apiKey\":{json}"),
            _ => String::new(),
        };
        if self.keyless {
            // The fingerprint's fields: this run's, and this trade's.
            return format!(
                "{{\"exchange\":\"{prefix}\",\"symbol\":\"S{j}\",\"action\":\"{action}\",\"quantity\":1{api_key}}}"
            );
        }
        format!(
            "{{\"exchange\":\"binance\",\"symbol\":\"BTCUSDT\",\"action\":\"{action}\",\"quantity\":{}.{:03},\"idempotencyKey\":\"{}-{j}\"{api_key}}}",
            milli / 1000,
            milli % 1000,
            prefix
        )
    }

    fn request(&self, body: String) -> Result<Request<Full<Bytes>>, Error> {
        let mut req = Request::post(self.target.request_uri.clone())
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if !self.target.http2 {
            req = req.header(hyper::header::HOST, self.target.authority.as_str());
        }
        match &self.auth {
            Auth::Bearer(value) => req = req.header(hyper::header::AUTHORIZATION, value.clone()),
            Auth::Hmac(secret) => {
                let ts = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let sig = sign(secret, ts, body.as_bytes())?;
                req = req
                    .header("x-hoox-timestamp", ts.to_string())
                    .header("x-hoox-signature", sig);
            }
            Auth::None | Auth::ApiKey(_) => {}
        }
        Ok(req.body(Full::new(Bytes::from(body)))?)
    }

    /// Which key the next request carries: a fresh one, or (at `dup_ratio`) one already issued.
    fn key_number(&self, rng: &mut Rng) -> u64 {
        let issued = self.fresh.load(Ordering::Relaxed);
        match self.keys {
            Some(k) => rng.next() % k,
            None if issued > 0 && rng.chance(self.dup_ratio) => rng.next() % issued,
            None => self.fresh.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// When request number `i` is due: its place on the schedule in open loop, `now` in closed
    /// loop; None once it is past the end of the run.
    fn due(&self, i: u64, now: Instant) -> Option<Instant> {
        if self.limit.is_some_and(|n| i >= n) {
            return None;
        }
        let due = match self.rate {
            Some(r) => self.start + Duration::from_secs_f64(i as f64 / r),
            None => now,
        };
        if self.deadline.is_some_and(|d| due >= d) {
            return None;
        }
        Some(due)
    }

    /// Waits for the next request to send; None when the run is over. Open loop: the instant
    /// it was due, which its latency counts from. Closed loop: now.
    async fn next_slot(&self) -> Option<Instant> {
        match &self.paced {
            Some(paced) => paced.take().await,
            None => {
                let i = self.next.fetch_add(1, Ordering::Relaxed);
                self.due(i, Instant::now())
            }
        }
    }
}

/// Requests released by the pacer, each with its due time, and not yet taken by a connection.
/// Any free connection takes the oldest; when none is free they wait here, and their latency
/// still counts from their due time, so a slow server cannot thin out the schedule (no
/// coordinated omission).
struct Paced {
    /// One permit per released request; at the end, one more per connection, to find the
    /// queue empty and the run over. Never closed.
    permits: Semaphore,
    released: std::sync::Mutex<VecDeque<Instant>>,
}

impl Paced {
    fn new() -> Paced {
        Paced {
            permits: Semaphore::new(0),
            released: std::sync::Mutex::new(VecDeque::new()),
        }
    }

    fn release(&self, due: Instant) {
        self.queue().push_back(due);
        self.permits.add_permits(1);
    }

    async fn take(&self) -> Option<Instant> {
        self.permits.acquire().await.ok()?.forget();
        self.queue().pop_front()
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Instant>> {
        // A queue of instants cannot be left half-updated; a poisoned lock is still whole.
        self.released.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the pacer reports of itself.
struct PacerReport {
    /// How late it woke for each request: the platform's timer precision, or a busy box.
    late_us: Histogram<u64>,
    /// Whether it got the real-time priority it asked for.
    realtime: bool,
}

/// The open-loop clock, on its own OS thread: sleep to each request's due time and release it,
/// stamped with that due time, however late the pacer woke: the requests due while it slept
/// past its time waited as long as if the server had made them wait.
fn pace(plan: &Plan, connections: u32) -> Result<PacerReport, Error> {
    let mut late_us = histogram()?;
    let Some(paced) = &plan.paced else {
        return Ok(PacerReport {
            late_us,
            realtime: false,
        });
    };
    // A thread's default timer slack lets the kernel wake it up to 50 µs late, to batch
    // wake-ups; the pacer wants its microseconds. Failure only costs precision.
    // SAFETY: PR_SET_TIMERSLACK takes one integer and touches only the calling thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    // On a busy box a woken thread may wait a scheduler slice for a core; the lowest real-time
    // priority puts the pacer first in line. At up to 20k/s it sleeps nearly all the time and
    // takes nothing from the servers; faster, it would hardly sleep, and a real-time thread
    // that does not sleep starves everyone else on its core. Needs CAP_SYS_NICE; without it
    // the pacer runs as a normal thread, and the report says so: its wake-ups, and so the
    // latencies, then include waiting behind the servers for a core.
    let realtime = plan.rate.is_some_and(|r| r <= 20_000.0) && {
        // musl's sched_param has SCHED_SPORADIC fields glibc's lacks: zero them, set the one.
        // SAFETY: sched_param is plain integers; all zeros is a valid value.
        let mut fifo: libc::sched_param = unsafe { std::mem::zeroed() };
        fifo.sched_priority = 1;
        // SAFETY: sets the calling thread's own policy from a valid, initialised sched_param.
        unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &fifo) == 0 }
    };
    let mut i = 0;
    while let Some(due) = plan.due(i, Instant::now()) {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let now = Instant::now();
        late_us.saturating_record(now.saturating_duration_since(due).as_micros() as u64);
        paced.release(due);
        i += 1;
    }
    paced.permits.add_permits(connections as usize);
    Ok(PacerReport { late_us, realtime })
}

async fn connection(plan: Arc<Plan>, mut conn: Option<Conn>, seed: u64) -> Result<Stats, Error> {
    let mut stats = Stats::new()?;
    let mut rng = Rng(seed | 1);
    while let Some(due) = plan.next_slot().await {
        let j = plan.key_number(&mut rng);
        // One the gateway closed while it sat idle is no failure of the gateway's: this
        // request goes out on a new one.
        if conn.as_ref().is_some_and(Conn::is_closed) {
            conn = None;
        }
        let sender = match conn.as_mut() {
            Some(c) => c,
            None => match tokio::time::timeout(plan.timeout, plan.target.connect()).await {
                Ok(Ok(c)) => conn.insert(c),
                _ => {
                    // The gateway is down (restarting, in the chaos test): back off a little
                    // rather than spin, and count the request as failed.
                    stats.error("connect");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let req = match plan.request(plan.body(j)) {
            Ok(req) => req,
            Err(_) => {
                stats.error("build");
                continue;
            }
        };
        // Closed loop: the clock starts as the request goes out, after building it.
        let sent = Instant::now();
        let start = if plan.paced.is_some() {
            let waited = sent.saturating_duration_since(due);
            stats
                .send_late_us
                .saturating_record(waited.as_micros() as u64);
            due
        } else {
            sent
        };
        let target = &plan.target;
        let exchange = async {
            let res = match sender.send(req).await {
                Ok(res) => res,
                // Closed as it was handed over, never written: once more, on a new
                // connection, within the same timeout.
                Err(SendError::Unsent(req)) => {
                    *sender = target.connect().await.map_err(|_| SendError::Connect)?;
                    sender.send(*req).await?
                }
                Err(e) => return Err(e),
            };
            let status = res.status().as_u16();
            let replayed = res
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true");
            res.into_body().collect().await?;
            Ok::<(u16, bool), SendError>((status, replayed))
        };
        match tokio::time::timeout(plan.timeout, exchange).await {
            Ok(Ok((status, replayed))) => {
                let done = Instant::now();
                stats
                    .latency_us
                    .saturating_record(done.saturating_duration_since(start).as_micros() as u64);
                *stats.status.entry(status).or_insert(0) += 1;
                if plan.deadline.is_none_or(|d| done <= d) {
                    stats.answers_in_window += 1;
                    stats.served_in_window += u64::from(plan.served(status));
                }
                if replayed && (200..300).contains(&status) {
                    stats.replayed += 1;
                } else if plan.record_ok_keys && (200..300).contains(&status) {
                    stats.ok_keys.push(j);
                }
            }
            Ok(Err(e)) => {
                stats.error(match e {
                    SendError::Connect => "connect",
                    SendError::Unsent(_) | SendError::Failed => "io",
                });
                conn = None;
            }
            Err(_) => {
                stats.error("timeout");
                conn = None;
            }
        }
    }
    Ok(stats)
}

pub async fn run(args: Args) -> Result<ExitCode, Error> {
    let target = Target::new(&args)?;
    let auth = Auth::load(args.auth, args.secret_file.as_ref())?;
    let seed = getrandom::u64()?;
    if args.key_prefix.as_deref().is_some_and(|p| !valid_prefix(p)) {
        return Err("--key-prefix: at most 200 of A-Z a-z 0-9 - _ . :".into());
    }
    // The gateway's bound on an exchange (gateway::trade).
    if args.keyless && args.key_prefix.as_ref().is_some_and(|p| p.len() > 32) {
        return Err("--key-prefix: at most 32 characters with --keyless (the exchange)".into());
    }
    let replay = match &args.replay_keys {
        Some(path) => Some(read_replay(path)?),
        None => None,
    };
    // A replay sends each of its keys once: that is its length.
    let limit = args
        .requests
        .or(replay.as_ref().map(|keys| keys.len() as u64));
    let duration = match (args.duration, limit) {
        (Some(d), _) => Some(d),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(10)),
    };
    // A year, and the clock's arithmetic is far from its end.
    if duration.is_some_and(|d| d > Duration::from_secs(366 * 86_400)) {
        return Err("--duration: at most a year".into());
    }
    // Asked before the run too: a wrong URL or a ledger that is down should cost no run
    // (the orders it places are real to the executor behind the gateway).
    if let Some(url) = &args.ledger {
        ledger::fetch(url).await?;
    }

    // Handshakes happen before the clock starts: the run measures requests, not TLS setup.
    let target = Arc::new(target);
    let mut handshakes = Vec::new();
    let timeout = args.timeout;
    for _ in 0..args.connections {
        let target = target.clone();
        // Bounded as every later connect is: a server that takes the connection and never
        // finishes its handshake (stopped, wedged) must end the run, not hang it.
        handshakes.push(tokio::spawn(async move {
            tokio::time::timeout(timeout, target.connect()).await
        }));
    }
    let mut ready = Vec::new();
    let mut failed = 0;
    for h in handshakes {
        match h.await {
            Ok(Ok(Ok(c))) => ready.push(Some(c)),
            _ => {
                failed += 1;
                ready.push(None);
            }
        }
    }
    if failed == args.connections as usize {
        // One more attempt for the message: the first error is what the user needs to see.
        let url = &args.url;
        match tokio::time::timeout(args.timeout, target.connect()).await {
            Ok(Err(e)) => return Err(format!("cannot connect to {url}: {e}").into()),
            Err(_) => {
                let t = humantime::format_duration(args.timeout);
                return Err(format!("cannot connect to {url}: no handshake within {t}").into());
            }
            Ok(Ok(_)) => {}
        }
    }
    let target = Arc::try_unwrap(target).map_err(|_| "connection setup still holds the target")?;

    let start = Instant::now();
    let plan = Arc::new(Plan {
        target,
        auth,
        key_prefix: args
            .key_prefix
            .clone()
            .unwrap_or_else(|| format!("load-{:08x}", seed as u32)),
        next: AtomicU64::new(0),
        fresh: AtomicU64::new(0),
        limit,
        start,
        // Within a year (checked above), far from the clock's end.
        deadline: duration.map(|d| start + d),
        rate: args.rate,
        paced: args.rate.map(|_| Paced::new()),
        dup_ratio: args.dup_ratio,
        keys: args.keys.filter(|&k| k > 0),
        timeout: args.timeout,
        replay,
        record_ok_keys: args.write_2xx_keys.is_some(),
        keyless: args.keyless,
        repeats: args.dup_ratio > 0.0
            || args.keys.is_some()
            || args.replay_keys.is_some()
            || args.key_prefix.is_some(),
    });
    let pacer = plan.paced.is_some().then(|| {
        let (plan, connections) = (plan.clone(), args.connections);
        std::thread::spawn(move || pace(&plan, connections))
    });
    let mut workers = Vec::new();
    for (n, conn) in ready.into_iter().enumerate() {
        let s = seed.wrapping_add((n as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        workers.push(tokio::spawn(connection(plan.clone(), conn, s)));
    }
    let mut total = Stats::new()?;
    for w in workers {
        total.merge(w.await??);
    }
    let wall = start.elapsed();
    // Throughput is the answers received within the run's window, divided by the window. With
    // --duration the window is that duration: the last requests are still out when it ends,
    // and waiting for them (one hung to --timeout would stretch a 1 s run to 10 s, cutting its
    // req/s tenfold) would measure the straggler, not the server. Their answers still count in
    // the latency and the statuses. With --requests the run is serving N requests, so its
    // window lasts until the last answer, straggler included.
    let window = duration.unwrap_or(wall);
    // Every connection has seen the run end, which the pacer signals as its last act: this
    // join returns at once.
    let pacer = match pacer {
        Some(p) => Some(p.join().map_err(|_| "the pacer thread panicked")??),
        None => None,
    };

    // The run's report and its keys first: a ledger that fails now loses neither.
    print_report(&args, &plan, &total, pacer.as_ref(), window, wall, failed);
    if let Some(path) = &args.write_2xx_keys {
        append_keys(path, &plan, &total.ok_keys).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let ledger = match &args.ledger {
        Some(url) => Some(ledger::fetch(url).await?),
        None => None,
    };
    let not_served: u64 = total
        .status
        .iter()
        .filter(|(status, _)| !plan.served(**status))
        .map(|(_, n)| n)
        .sum();
    let transport = total.errors.values().sum::<u64>() + failed as u64;
    // Every replayed key got a 2xx before: a 2xx now is that trade forwarded again (but
    // for a stored answer replayed), which the ledger sees only when there is one.
    let forwarded_again: u64 = match &plan.replay {
        Some(_) => total
            .status
            .iter()
            .filter(|(status, _)| (200..300).contains(*status))
            .map(|(_, n)| n)
            .sum::<u64>()
            .saturating_sub(total.replayed),
        None => 0,
    };
    let replays = plan.replay.as_ref().map_or(0, Vec::len) as u64;
    if forwarded_again > 0 {
        eprintln!(
            "replay: FAIL, {forwarded_again} of {replays} replayed keys answered 2xx: forwarded again"
        );
    }
    let held = total.status.get(&409).copied().unwrap_or(0) + total.replayed;
    let unproven = replays.saturating_sub(held + forwarded_again);
    if unproven > 0 {
        eprintln!(
            "replay: FAIL, {unproven} of {replays} replayed keys not shown held (answered \
             neither 409 nor their stored answer, or not at all)"
        );
    }
    let ledger = ledger.map(|counts| ledger::report(&counts, args.json));
    Ok(match ledger {
        Some(code) if code != ExitCode::SUCCESS => code,
        _ if forwarded_again > 0 => ExitCode::from(EXIT_REPLAY_FORWARDED),
        _ if unproven > 0 => ExitCode::from(EXIT_REPLAY_UNPROVEN),
        _ if total.latency_us.is_empty() => ExitCode::from(3),
        _ if not_served + transport > 0 && !args.expect_errors => ExitCode::from(EXIT_ERRORS),
        _ => ExitCode::SUCCESS,
    })
}

/// Appends the keys `numbers` to `path`, one per line.
fn append_keys(path: &std::path::Path, plan: &Plan, numbers: &[u64]) -> std::io::Result<()> {
    use std::io::Write;
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)?;
    let mut out = std::io::BufWriter::new(file);
    for &j in numbers {
        writeln!(out, "{}", plan.key_string(j))?;
    }
    out.flush()
}

fn print_report(
    args: &Args,
    plan: &Plan,
    total: &Stats,
    pacer: Option<&PacerReport>,
    window: Duration,
    wall: Duration,
    failed_handshakes: usize,
) {
    let h = &total.latency_us;
    let responses = h.len();
    let served_total: u64 = total
        .status
        .iter()
        .filter(|(status, _)| plan.served(**status))
        .map(|(_, n)| n)
        .sum();
    let secs = window.as_secs_f64();
    let per_s = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    // Served answers per second: what bench.sh's ratios compare. All answers, for reference.
    let rps = per_s(total.served_in_window);
    let answers_rps = per_s(total.answers_in_window);
    let q = |x: f64| h.value_at_quantile(x);
    let protocol = if args.http2 { "h2" } else { "http/1.1" };
    let mode = match args.rate {
        Some(r) => format!("open loop {r}/s"),
        None => "closed loop".to_string(),
    };
    // Open loop: how late the generator was against the schedule. The pacer's lateness is its
    // own clock; a send's includes waiting for a free connection (the server's doing).
    let late = pacer.map(|pacer| {
        let (send, pacer) = (&total.send_late_us, &pacer.late_us);
        (
            [
                pacer.value_at_quantile(0.5),
                pacer.value_at_quantile(0.99),
                pacer.max(),
            ],
            [
                send.value_at_quantile(0.5),
                send.value_at_quantile(0.99),
                send.max(),
            ],
        )
    });
    if args.json {
        // Names unlike the latency's: scripts pick fields by name (see scripts/bench.sh).
        let generator = late.map(|(late, send)| {
            serde_json::json!({
                "pacer_late_p50_us": late[0], "pacer_late_p99_us": late[1],
                "pacer_late_max_us": late[2], "send_late_p50_us": send[0],
                "send_late_p99_us": send[1], "send_late_max_us": send[2],
                "pacer_realtime": pacer.is_some_and(|p| p.realtime),
            })
        });
        let status: BTreeMap<String, u64> = total
            .status
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        let out = serde_json::json!({
            "url": plan.target.uri.to_string(), "protocol": protocol, "connections": args.connections,
            "mode": mode, "rate": args.rate, "dup_ratio": args.dup_ratio,
            "elapsed_s": secs, "wall_s": wall.as_secs_f64(), "responses": responses,
            "served": served_total, "throughput_rps": rps, "answers_rps": answers_rps,
            "latency_us": { "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p99_9": q(0.999),
                            "max": h.max(), "mean": h.mean() },
            "status": status, "replayed": total.replayed, "errors": total.errors,
            "failed_handshakes": failed_handshakes,
            "generator": generator,
        });
        println!("{out}");
        return;
    }
    println!(
        "hoox-load: {} {protocol}, {} connections, {mode}, {secs:.2} s",
        plan.target.uri, args.connections
    );
    println!(
        "  responses  {responses}, served {served_total}   throughput {rps:.1} served/s, {answers_rps:.1} answers/s"
    );
    println!(
        "  latency us p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999),
        h.max()
    );
    if let Some((late, send)) = late {
        let realtime = if pacer.is_some_and(|p| p.realtime) {
            "real-time"
        } else {
            "not real-time"
        };
        println!(
            "  late us    pacer ({realtime}) p50 {}  p99 {}  max {};  send p50 {}  p99 {}  max {}",
            late[0], late[1], late[2], send[0], send[1], send[2]
        );
    }
    let status: Vec<String> = total
        .status
        .iter()
        .map(|(k, v)| format!("{k} x {v}"))
        .collect();
    println!(
        "  status     {}",
        if status.is_empty() {
            "none".to_string()
        } else {
            status.join(", ")
        }
    );
    if total.replayed > 0 {
        println!(
            "  replayed   {} (2xx to duplicates: the stored answer, Idempotent-Replayed)",
            total.replayed
        );
    }
    if !total.errors.is_empty() || failed_handshakes > 0 {
        let errors: Vec<String> = total
            .errors
            .iter()
            .map(|(k, v)| format!("{k} x {v}"))
            .collect();
        println!(
            "  errors     {} (failed initial handshakes: {failed_handshakes})",
            errors.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(auth: Auth) -> Plan {
        let start = Instant::now();
        Plan {
            target: Target {
                uri: Uri::from_static("https://127.0.0.1:1/webhook"),
                request_uri: Uri::from_static("/webhook"),
                authority: "127.0.0.1:1".into(),
                addr: "127.0.0.1:1".into(),
                server_name: ServerName::try_from("localhost").unwrap(),
                tls: TlsConnector::from(Arc::new(
                    rustls::ClientConfig::builder_with_provider(Arc::new(
                        rustls::crypto::ring::default_provider(),
                    ))
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
                )),
                http2: false,
            },
            auth,
            key_prefix: "p".into(),
            next: AtomicU64::new(0),
            fresh: AtomicU64::new(0),
            limit: Some(3),
            start,
            deadline: None,
            rate: None,
            paced: None,
            dup_ratio: 0.0,
            keys: None,
            timeout: Duration::from_secs(1),
            replay: None,
            record_ok_keys: false,
            keyless: false,
            repeats: false,
        }
    }

    /// A 409 is throughput only in a run that may repeat a trade: in one of fresh keys it
    /// is a gateway refusing new trades as duplicates, and must neither lift the ratios nor
    /// pass (exit 4). 2xx always; other refusals never.
    #[test]
    fn a_409_is_served_only_in_a_run_that_repeats() {
        let mut p = plan(Auth::None);
        assert!(p.served(200) && p.served(201));
        assert!(!p.served(409) && !p.served(503) && !p.served(422));
        p.repeats = true;
        assert!(p.served(409) && p.served(200));
        assert!(!p.served(503) && !p.served(422));
    }

    #[test]
    fn body_is_a_hoox_trade_and_a_repeated_key_repeats_the_trade() {
        let p = plan(Auth::ApiKey(serde_json::to_string("s\"cret").unwrap()));
        let v: serde_json::Value = serde_json::from_str(&p.body(1999)).unwrap();
        assert_eq!(v["exchange"], "binance");
        assert_eq!(v["symbol"], "BTCUSDT");
        assert_eq!(v["action"], "SHORT");
        assert_eq!(v["quantity"].as_f64(), Some(1.0));
        assert_eq!(v["idempotencyKey"], "p-1999");
        assert_eq!(v["apiKey"], "s\"cret");
        assert_eq!(p.body(7), p.body(7));
        assert_ne!(p.body(7), p.body(8));
        // Keyless: a trade the gateway reads, its fingerprint its only key.
        let p = Plan {
            keyless: true,
            ..plan(Auth::None)
        };
        let trade = hoox_edge::gateway::trade::parse_object(p.body(1999).into())
            .and_then(hoox_edge::gateway::trade::Trade::from_object)
            .unwrap();
        assert_eq!(trade.idempotency_key(), None);
        let v: serde_json::Value = serde_json::from_str(&p.body(1999)).unwrap();
        assert_eq!(
            (&v["exchange"], &v["symbol"]),
            (&"p".into(), &"S1999".into())
        );
        assert_eq!(p.body(7), p.body(7));
        assert_ne!(p.body(7), p.body(8));
    }

    #[test]
    fn hmac_signature_matches_openssl() {
        // printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac 'k3y'
        assert_eq!(
            sign(b"k3y", 1_700_000_000, br#"{"a":1}"#).unwrap(),
            "sha256=fd5a70e965043f7df6309c2c3b5ff5a8ffa99b1f5175e9a311459e73c4634d4a"
        );
    }

    #[test]
    fn bearer_header_and_request_shape() {
        let value = hyper::header::HeaderValue::from_static("Bearer t0k");
        let p = plan(Auth::Bearer(value));
        let req = p.request(p.body(0)).unwrap();
        assert_eq!(req.uri(), "/webhook");
        assert_eq!(req.headers()[hyper::header::HOST], "127.0.0.1:1");
        assert_eq!(req.headers()[hyper::header::AUTHORIZATION], "Bearer t0k");
    }

    #[tokio::test]
    async fn request_limit_ends_the_run() {
        let p = plan(Auth::None);
        let mut n = 0;
        while p.next_slot().await.is_some() {
            n += 1;
        }
        assert_eq!(n, 3);
    }

    #[test]
    fn schedule_is_fixed_by_rate_and_ends_at_limit_or_deadline() {
        let mut p = plan(Auth::None);
        let now = p.start + Duration::from_secs(7);
        // Closed loop: due whenever asked.
        assert_eq!(p.due(0, now), Some(now));
        assert_eq!(p.due(3, now), None);
        // Open loop: request i is due i / rate after the start, however late it is asked for.
        p.rate = Some(1000.0);
        p.limit = None;
        assert_eq!(p.due(0, now), Some(p.start));
        assert_eq!(
            p.due(1500, now),
            Some(p.start + Duration::from_millis(1500))
        );
        // The deadline cuts off the requests due at or after it.
        p.deadline = Some(p.start + Duration::from_secs(2));
        assert_eq!(
            p.due(1999, now),
            Some(p.start + Duration::from_millis(1999))
        );
        assert_eq!(p.due(2000, now), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn paced_requests_are_each_released_once_and_never_before_due() {
        let mut p = plan(Auth::None);
        p.rate = Some(2000.0);
        p.limit = Some(40);
        p.paced = Some(Paced::new());
        let p = Arc::new(p);
        let connections = 3;
        let pacer = {
            let p = p.clone();
            std::thread::spawn(move || pace(&p, connections))
        };
        let mut tasks = Vec::new();
        for _ in 0..connections {
            let p = p.clone();
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(released) = p.next_slot().await {
                    got.push(released);
                }
                got
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all.sort();
        assert_eq!(all.len(), 40);
        for (i, released) in all.iter().enumerate() {
            assert!(
                *released >= p.due(i as u64, p.start).unwrap(),
                "request {i} early"
            );
        }
        assert_eq!(pacer.join().unwrap().unwrap().late_us.len(), 40);
    }

    /// A pacer that wakes late (descheduled on a busy box: here, started 300 ms after the
    /// schedule) still stamps each request with its due time, so the requests due while it
    /// slept count that wait as latency; stamped with the release time, they would hide it.
    #[tokio::test]
    async fn a_late_pacer_stamps_each_request_with_its_due_time() {
        let mut p = plan(Auth::None);
        p.rate = Some(1000.0);
        p.limit = Some(300);
        p.paced = Some(Paced::new());
        p.start = Instant::now()
            .checked_sub(Duration::from_millis(300))
            .unwrap();
        let p = Arc::new(p);
        let pacer = {
            let p = p.clone();
            std::thread::spawn(move || pace(&p, 1))
        };
        let mut stamps = Vec::new();
        while let Some(due) = p.next_slot().await {
            stamps.push(due);
        }
        let taken = Instant::now();
        assert_eq!(stamps.len(), 300);
        for (i, stamp) in stamps.iter().enumerate() {
            assert_eq!(Some(*stamp), p.due(i as u64, p.start), "request {i}");
        }
        // Half of them were due 150 ms or more before anyone could take them.
        let waited = taken.duration_since(stamps[150]);
        assert!(waited >= Duration::from_millis(140), "{waited:?}");
        let report = pacer.join().unwrap().unwrap();
        assert!(report.late_us.value_at_quantile(0.5) >= 100_000);
    }

    #[test]
    fn replayed_keys_carry_their_first_trade() {
        let mut p = plan(Auth::None);
        let original = p.body(1234);
        p.replay = Some(vec![("q".into(), 5), ("p".into(), 1234)]);
        p.key_prefix = "unused".into();
        assert_eq!(p.body(1), original);
        assert_eq!(p.key_string(0), "q-5");
        // Beyond the file: our own keys (never sent: the run's limit is the file's length).
        assert_eq!(p.key_string(2), "unused-2");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        std::fs::write(&file, "a-b-1\n\nchaos-7-12\n").unwrap();
        assert_eq!(
            read_replay(&file).unwrap(),
            [("a-b".to_string(), 1), ("chaos-7".to_string(), 12)]
        );
        std::fs::write(&file, "a-b-1\nnot/a-key-2\n").unwrap();
        assert!(
            read_replay(&file)
                .unwrap_err()
                .to_string()
                .contains(":2: not a key")
        );
        std::fs::write(&file, "\n").unwrap();
        assert!(read_replay(&file).is_err());
    }

    #[test]
    fn repeats_draw_only_from_issued_keys() {
        let mut p = plan(Auth::None);
        let mut rng = Rng(7);
        // Always repeat, but nothing issued yet: the first key is a new one all the same.
        p.dup_ratio = 1.0;
        assert_eq!(p.key_number(&mut rng), 0);
        assert_eq!(p.key_number(&mut rng), 0);
        // No repeats: the next keys in order (1, 2, ...), so a replay run covers exactly
        // keys 0..N.
        p.dup_ratio = 0.0;
        assert_eq!(
            (0..4).map(|_| p.key_number(&mut rng)).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        // Always repeat: never a new key, always one of the five issued.
        p.dup_ratio = 1.0;
        assert!((0..1000).all(|_| p.key_number(&mut rng) < 5));
        assert_eq!(p.fresh.load(Ordering::Relaxed), 5);
        // Half and half, over many draws: the generator's bits stay mixed (a fixed seed, so
        // the count is the same every run; a broken generator strays far outside).
        p.dup_ratio = 0.5;
        for _ in 0..10_000 {
            p.key_number(&mut rng);
        }
        let new = p.fresh.load(Ordering::Relaxed) - 5;
        assert!((4_700..=5_300).contains(&new), "{new} new keys of 10,000");
        // A storm: every key within --keys.
        p.keys = Some(3);
        assert!((0..1000).all(|_| p.key_number(&mut rng) < 3));
    }

    #[test]
    fn rate_and_ratio_parsing() {
        assert_eq!(parse_rate("1000/s"), Ok(1000.0));
        assert_eq!(parse_rate("250"), Ok(250.0));
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("fast").is_err());
        // The ends are in; beyond them, an hours-long silence or a schedule that overflows.
        assert_eq!(parse_rate("0.01/s"), Ok(0.01));
        assert_eq!(parse_rate("10000000"), Ok(1e7));
        for beyond in ["0.009/s", "1e-300", "1e8", "inf", "NaN"] {
            assert!(parse_rate(beyond).is_err(), "{beyond}");
        }
        assert!(parse_ratio("1.5").is_err());
        assert_eq!(parse_ratio("0.25"), Ok(0.25));
    }
}
