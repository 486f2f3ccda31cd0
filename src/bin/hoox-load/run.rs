//! `hoox-load run`: N TLS connections sending HOOX-shaped trades, closed loop (each connection
//! sends its next request the moment the last one is answered) or open loop (`--rate`: requests
//! are due on a fixed schedule, and latency counts from when a request was released, not when
//! it was sent, so a stalled server cannot hide its stall by slowing the client down).
//!
//! No tokio timer stands between two requests: tokio's timer wheel ticks every millisecond and
//! rounds a deadline up to the next tick, which would add up to 1 ms to every request and
//! measure the generator, not the server. Open loop is paced by one OS thread sleeping with
//! `std::thread::sleep` (an hrtimer), which releases each request at its due time; any free
//! connection takes it. How late the pacer woke (the platform's timer precision: on a small VM
//! p50 ~20 µs, p99 ~150 µs, rarely 1 ms) is reported apart and not counted as latency; waiting
//! for a free connection is counted.

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
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "requests")]
    duration: Option<Duration>,
    /// Send exactly this many requests.
    #[arg(long)]
    requests: Option<u64>,
    /// Open loop at this rate, e.g. 1000/s; latency counts from each request's release time.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<f64>,
    /// Share of requests that repeat an earlier key (same trade), 0.0..=1.0.
    #[arg(long, default_value_t = 0.0, value_parser = parse_ratio)]
    dup_ratio: f64,
    /// Draw every key from this many (a storm: many connections, few keys); overrides --dup-ratio.
    #[arg(long)]
    keys: Option<u64>,
    /// Key prefix; runs that share it share keys (the chaos test retries across restarts).
    #[arg(long)]
    key_prefix: Option<String>,
    /// How to authenticate; the secret is read from --secret-file, never from the command line.
    #[arg(long, value_enum, requires = "secret_file")]
    auth: Option<AuthKind>,
    /// File whose first line is the secret.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Per-request timeout.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    timeout: Duration,
    /// Ledger to check at the end (http://HOST:PORT/ledger); exit 1 if a key was forwarded twice.
    #[arg(long)]
    ledger: Option<String>,
    /// Machine-readable output, one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(clap::ValueEnum, Clone, Copy)]
enum AuthKind {
    Bearer,
    Apikey,
    Hmac,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let n = s.strip_suffix("/s").unwrap_or(s);
    match n.parse::<f64>() {
        Ok(r) if r > 0.0 && r.is_finite() => Ok(r),
        _ => Err(format!(
            "rate must be a positive number per second, like 1000/s: {s}"
        )),
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
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let secret = text.lines().next().map(str::trim).unwrap_or("");
        if secret.is_empty() {
            return Err(format!("{}: no secret on the first line", file.display()).into());
        }
        Ok(match kind {
            AuthKind::Bearer => {
                let mut value = hyper::header::HeaderValue::try_from(format!("Bearer {secret}"))
                    .map_err(|_| {
                        format!("{}: secret is not a valid header value", file.display())
                    })?;
                value.set_sensitive(true);
                Auth::Bearer(value)
            }
            AuthKind::Apikey => Auth::ApiKey(serde_json::to_string(secret)?),
            AuthKind::Hmac => Auth::Hmac(secret.as_bytes().to_vec()),
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

impl Conn {
    async fn send(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, hyper::Error> {
        match self {
            Conn::H1(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
            Conn::H2(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
        }
    }
}

/// 1 µs .. 60 s at 3 significant figures: a few hundred KiB each.
fn histogram() -> Result<Histogram<u64>, Error> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

/// What one connection measured; merged at the end.
struct Stats {
    latency_us: Histogram<u64>,
    /// Open loop only: how long after its release each request went out. Includes waiting for
    /// a free connection, so it grows when the server falls behind, not only when we do.
    send_late_us: Histogram<u64>,
    status: BTreeMap<u16, u64>,
    errors: BTreeMap<&'static str, u64>,
}

impl Stats {
    fn new() -> Result<Stats, Error> {
        Ok(Stats {
            latency_us: histogram()?,
            send_late_us: histogram()?,
            status: BTreeMap::new(),
            errors: BTreeMap::new(),
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
}

impl Plan {
    /// The trade for key number `j`: a repeated key carries the very same trade, so the gateway
    /// sees a duplicate (409) rather than a reused key with a different trade (422).
    fn body(&self, j: u64) -> String {
        let milli = 1 + j % 1000;
        let action = if j.is_multiple_of(2) { "LONG" } else { "SHORT" };
        let api_key = match &self.auth {
            Auth::ApiKey(json) => format!(",\"apiKey\":{json}"),
            _ => String::new(),
        };
        format!(
            "{{\"exchange\":\"binance\",\"symbol\":\"BTCUSDT\",\"action\":\"{action}\",\"quantity\":{}.{:03},\"idempotencyKey\":\"{}-{j}\"{api_key}}}",
            milli / 1000,
            milli % 1000,
            self.key_prefix
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
    /// the pacer released it, which its latency counts from. Closed loop: now.
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

/// Requests released by the pacer and not yet taken by a connection. Any free connection takes
/// the oldest; when none is free they wait here, and their latency still counts from release,
/// so a slow server cannot thin out the schedule (no coordinated omission).
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

    fn release(&self, at: Instant) {
        self.queue().push_back(at);
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

/// The open-loop clock, on its own OS thread: sleep to each request's due time and release it.
/// Returns how late the pacer woke: the platform's timer precision, not the server's doing, so
/// it is reported on its own and kept out of the latency.
fn pace(plan: &Plan, connections: u32) -> Result<Histogram<u64>, Error> {
    let mut late_us = histogram()?;
    let Some(paced) = &plan.paced else {
        return Ok(late_us);
    };
    // A thread's default timer slack lets the kernel wake it up to 50 µs late, to batch
    // wake-ups; the pacer wants its microseconds. Failure only costs precision.
    // SAFETY: PR_SET_TIMERSLACK takes one integer and touches only the calling thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    // On a busy box a woken thread may wait a scheduler slice for a core; the lowest real-time
    // priority puts the pacer first in line. At up to 20k/s it sleeps nearly all the time and
    // takes nothing from the servers; faster, it would hardly sleep, and a real-time thread
    // that does not sleep starves everyone else on its core. Needs CAP_SYS_NICE; without it
    // the pacer runs as a normal thread.
    if plan.rate.is_some_and(|r| r <= 20_000.0) {
        // musl's sched_param has SCHED_SPORADIC fields glibc's lacks: zero them, set the one.
        // SAFETY: sched_param is plain integers; all zeros is a valid value.
        let mut fifo: libc::sched_param = unsafe { std::mem::zeroed() };
        fifo.sched_priority = 1;
        // SAFETY: sets the calling thread's own policy from a valid, initialised sched_param.
        unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &fifo) };
    }
    let mut i = 0;
    while let Some(due) = plan.due(i, Instant::now()) {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let now = Instant::now();
        late_us.saturating_record(now.saturating_duration_since(due).as_micros() as u64);
        paced.release(now);
        i += 1;
    }
    paced.permits.add_permits(connections as usize);
    Ok(late_us)
}

async fn connection(plan: Arc<Plan>, mut conn: Option<Conn>, seed: u64) -> Result<Stats, Error> {
    let mut stats = Stats::new()?;
    let mut rng = Rng(seed | 1);
    while let Some(released) = plan.next_slot().await {
        let j = plan.key_number(&mut rng);
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
            let waited = sent.saturating_duration_since(released);
            stats
                .send_late_us
                .saturating_record(waited.as_micros() as u64);
            released
        } else {
            sent
        };
        let exchange = async {
            let res = sender.send(req).await?;
            let status = res.status().as_u16();
            res.into_body().collect().await?;
            Ok::<u16, hyper::Error>(status)
        };
        match tokio::time::timeout(plan.timeout, exchange).await {
            Ok(Ok(status)) => {
                stats
                    .latency_us
                    .saturating_record(start.elapsed().as_micros() as u64);
                *stats.status.entry(status).or_insert(0) += 1;
            }
            Ok(Err(_)) => {
                stats.error("io");
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
    // The prefix goes into JSON and headers unescaped, and keys are at most 255 characters.
    if let Some(p) = &args.key_prefix {
        let ok = p.len() <= 200
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
        if !ok {
            return Err("--key-prefix: at most 200 of A-Z a-z 0-9 - _ . :".into());
        }
    }
    let duration = match (args.duration, args.requests) {
        (Some(d), _) => Some(d),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(10)),
    };

    // Handshakes happen before the clock starts: the run measures requests, not TLS setup.
    let target = Arc::new(target);
    let mut handshakes = Vec::new();
    for _ in 0..args.connections {
        let target = target.clone();
        handshakes.push(tokio::spawn(async move { target.connect().await }));
    }
    let mut ready = Vec::new();
    let mut failed = 0;
    for h in handshakes {
        match h.await {
            Ok(Ok(c)) => ready.push(Some(c)),
            _ => {
                failed += 1;
                ready.push(None);
            }
        }
    }
    if failed == args.connections as usize {
        // One more attempt for the message: the first error is what the user needs to see.
        target
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", args.url))?;
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
        limit: args.requests,
        start,
        deadline: duration.map(|d| start + d),
        rate: args.rate,
        paced: args.rate.map(|_| Paced::new()),
        dup_ratio: args.dup_ratio,
        keys: args.keys.filter(|&k| k > 0),
        timeout: args.timeout,
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
    let elapsed = start.elapsed();
    // Every connection has seen the run end, which the pacer signals as its last act: this
    // join returns at once.
    let pacer_late_us = match pacer {
        Some(p) => Some(p.join().map_err(|_| "the pacer thread panicked")??),
        None => None,
    };

    let ledger = match &args.ledger {
        Some(url) => Some(ledger::fetch(url).await?),
        None => None,
    };
    print_report(
        &args,
        &plan,
        &total,
        pacer_late_us.as_ref(),
        elapsed,
        failed,
    );
    match ledger {
        Some(counts) => Ok(ledger::report(&counts, args.json)),
        None if total.latency_us.is_empty() => Ok(ExitCode::from(3)),
        None => Ok(ExitCode::SUCCESS),
    }
}

fn print_report(
    args: &Args,
    plan: &Plan,
    total: &Stats,
    pacer_late_us: Option<&Histogram<u64>>,
    elapsed: Duration,
    failed_handshakes: usize,
) {
    let h = &total.latency_us;
    let responses = h.len();
    let secs = elapsed.as_secs_f64();
    let rps = if secs > 0.0 {
        responses as f64 / secs
    } else {
        0.0
    };
    let q = |x: f64| h.value_at_quantile(x);
    let protocol = if args.http2 { "h2" } else { "http/1.1" };
    let mode = match args.rate {
        Some(r) => format!("open loop {r}/s"),
        None => "closed loop".to_string(),
    };
    // Open loop: how late the generator was against the schedule. The pacer's lateness is its
    // own clock; a send's includes waiting for a free connection (the server's doing).
    let late = pacer_late_us.map(|pacer| {
        let send = &total.send_late_us;
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
        let generator = late.map(|(pacer, send)| {
            serde_json::json!({
                "pacer_late_p50_us": pacer[0], "pacer_late_p99_us": pacer[1],
                "pacer_late_max_us": pacer[2], "send_late_p50_us": send[0],
                "send_late_p99_us": send[1], "send_late_max_us": send[2],
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
            "elapsed_s": secs, "responses": responses, "throughput_rps": rps,
            "latency_us": { "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p99_9": q(0.999),
                            "max": h.max(), "mean": h.mean() },
            "status": status, "errors": total.errors, "failed_handshakes": failed_handshakes,
            "generator": generator,
        });
        println!("{out}");
        return;
    }
    println!(
        "hoox-load: {} {protocol}, {} connections, {mode}, {secs:.2} s",
        plan.target.uri, args.connections
    );
    println!("  responses  {responses}   throughput {rps:.1} req/s");
    println!(
        "  latency us p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999),
        h.max()
    );
    if let Some((pacer, send)) = late {
        println!(
            "  late us    pacer p50 {}  p99 {}  max {};  send p50 {}  p99 {}  max {}",
            pacer[0], pacer[1], pacer[2], send[0], send[1], send[2]
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
        }
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
        assert_eq!(pacer.join().unwrap().unwrap().len(), 40);
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
        assert!(parse_ratio("1.5").is_err());
        assert_eq!(parse_ratio("0.25"), Ok(0.25));
    }
}
