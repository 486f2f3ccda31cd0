//! The ledger: an executor that remembers. It fills every order it is sent and counts each
//! `Idempotency-Key`; a key seen twice is an order placed twice, the one thing the gateway
//! exists to prevent. So is a trade sent without a key forwarded again within a minute of
//! its first, under the next minute's fingerprint (`trade:…:{minute}`): the gateway holds
//! a fingerprint 60 s whatever its minute (SPEC §2), and counting key strings alone could
//! not see that. Plain HTTP/1.1 on loopback, as an exchange adapter next door would be.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};

use crate::Error;

/// What `GET /ledger` answers.
#[derive(Serialize, Deserialize, Debug, Default)]
pub struct Counts {
    /// Orders received.
    pub total: u64,
    /// Distinct keys among them.
    pub unique: u64,
    /// Keys received more than once.
    pub duplicates: Vec<String>,
    /// Orders that came without an Idempotency-Key.
    #[serde(default)]
    pub missing_key: u64,
}

/// How long after a fingerprint's first order the same trade forwarded again is a double:
/// the gateway's minute, less a second's slack either way, since the ledger times orders
/// as they arrive, not as the gateway reserved them.
const FINGERPRINT_HOLD: Duration = Duration::from_secs(58);

#[derive(Default)]
struct Book {
    seen: HashMap<String, u32>,
    /// Each fingerprint's trade (its key less the minute), and when its last order came.
    trades: HashMap<String, Instant>,
    /// Fingerprints whose trade had come within [`FINGERPRINT_HOLD`] under another minute.
    repeated: BTreeSet<String>,
    total: u64,
    missing_key: u64,
}

impl Book {
    fn take(&mut self, key: String, now: Instant) {
        self.total += 1;
        if let Some((trade, _minute)) = key.strip_prefix("trade:").and_then(|k| k.rsplit_once(':'))
        {
            let last = self.trades.insert(trade.to_owned(), now);
            if last.is_some_and(|at| now - at < FINGERPRINT_HOLD) && !self.seen.contains_key(&key) {
                self.repeated.insert(key.clone());
            }
        }
        *self.seen.entry(key).or_insert(0) += 1;
    }

    fn counts(&self) -> Counts {
        let mut duplicates: Vec<String> = self
            .seen
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, _)| k.clone())
            .chain(self.repeated.iter().cloned())
            .collect();
        // A fingerprint repeated across minutes, then sent again in its own: once.
        duplicates.sort();
        duplicates.dedup();
        Counts {
            total: self.total,
            unique: self.seen.len() as u64,
            duplicates,
            missing_key: self.missing_key,
        }
    }
}

fn json(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(body)));
    *res.status_mut() = status;
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    res
}

async fn answer(
    book: Arc<Mutex<Book>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    if req.method() == Method::GET && req.uri().path() == "/ledger" {
        let counts = lock(&book).counts();
        let body = serde_json::to_vec(&counts).unwrap_or_default();
        return Ok(json(StatusCode::OK, body));
    }
    // Every key taken, one a line: orders a killed gateway forwarded and never answered
    // are among them, for a replay to find held.
    if req.method() == Method::GET && req.uri().path() == KEYS_PATH {
        let mut keys: Vec<String> = lock(&book).seen.keys().cloned().collect();
        keys.sort();
        let body = keys.into_iter().fold(String::new(), |mut b, k| {
            b.push_str(&k);
            b.push('\n');
            b
        });
        return Ok(Response::new(Full::new(Bytes::from(body))));
    }
    if req.method() != Method::POST {
        return Ok(json(StatusCode::METHOD_NOT_ALLOWED, b"{}".to_vec()));
    }
    let key = req
        .headers()
        .get("idempotency-key")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    req.into_body().collect().await?;
    {
        let mut book = lock(&book);
        match key {
            Some(key) => book.take(key, Instant::now()),
            None => {
                book.total += 1;
                book.missing_key += 1;
            }
        }
    }
    Ok(json(StatusCode::OK, b"{\"success\":true}".to_vec()))
}

/// A poisoned lock only means a handler panicked mid-update of plain counters; the counts are
/// still the best record we have, so keep serving them.
fn lock(book: &Mutex<Book>) -> std::sync::MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub async fn serve(listen: SocketAddr) -> Result<ExitCode, Error> {
    let listener = TcpListener::bind(listen).await?;
    println!(
        "hoox-load: ledger on http://{}/orders (counts at /ledger)",
        listener.local_addr()?
    );
    serve_on(listener).await
}

async fn serve_on(listener: TcpListener) -> Result<ExitCode, Error> {
    let book = Arc::new(Mutex::new(Book::default()));
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                eprintln!("hoox-load: ledger accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let book = book.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| answer(book.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

/// Where a ledger lists every key it has taken, beside its counts' `/ledger`.
const KEYS_PATH: &str = "/ledger/keys";

/// GET the ledger's counts over plain HTTP/1.1 (`http://HOST:PORT/PATH`).
pub async fn fetch(url: &str) -> Result<Counts, Error> {
    // Every failure names the ledger: "connection refused" alone reads as the gateway's.
    let body = read(url).await.map_err(|e| format!("ledger {url}: {e}"))?;
    Ok(serde_json::from_slice(&body).map_err(|e| format!("ledger {url}: {e}"))?)
}

/// Where the ledger whose counts are at `url` lists its keys: the same host, at
/// [`KEYS_PATH`] (a host named `ledger…` is not a path).
fn keys_url(url: &str) -> Result<String, Error> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("ledger {url}: {e}"))?;
    match uri.authority() {
        Some(host) => Ok(format!("http://{host}{KEYS_PATH}")),
        None => Err(format!("ledger {url}: the URL has no host").into()),
    }
}

/// GET every key the ledger at `url` (its counts' URL) has taken, one a line.
async fn fetch_keys(url: &str) -> Result<Bytes, Error> {
    let keys = keys_url(url)?;
    Ok(read(&keys)
        .await
        .map_err(|e| format!("ledger {keys}: {e}"))?)
}

async fn read(url: &str) -> Result<Bytes, Error> {
    let uri: hyper::Uri = url.parse()?;
    if uri.scheme_str() != Some("http") {
        return Err("the URL must be http://".into());
    }
    let authority = uri.authority().ok_or("the URL has no host")?.clone();
    let tcp = TcpStream::connect(authority.as_str()).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let req = Request::get(uri.path())
        .header(hyper::header::HOST, authority.as_str())
        .body(Empty::<Bytes>::new())?;
    let res = sender.send_request(req).await?;
    if !res.status().is_success() {
        return Err(format!("answered {} (its path is /ledger)", res.status()).into());
    }
    Ok(res.into_body().collect().await?.to_bytes())
}

/// Print the counts; the verdict: no key forwarded twice, and every order carried a key (an
/// order without one is an order the ledger cannot check, and one the executor could not
/// deduplicate either).
pub fn report(counts: &Counts, json: bool) -> ExitCode {
    let once = counts.duplicates.is_empty();
    let keyed = counts.missing_key == 0;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "ledger": counts, "no_key_forwarded_twice": once,
                "every_order_had_a_key": keyed, "ok": once && keyed,
            })
        );
    } else {
        println!(
            "ledger: {} orders, {} unique keys, {} without key, {} keys forwarded twice",
            counts.total,
            counts.unique,
            counts.missing_key,
            counts.duplicates.len()
        );
        if !keyed {
            println!(
                "ledger: FAIL, {} orders without an Idempotency-Key",
                counts.missing_key
            );
        }
        if once && keyed {
            println!("ledger: OK, no key forwarded twice, every order with a key");
        } else if !once {
            let shown: Vec<&str> = counts
                .duplicates
                .iter()
                .take(10)
                .map(String::as_str)
                .collect();
            println!("ledger: FAIL, keys forwarded twice: {}", shown.join(", "));
        }
    }
    if once && keyed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `check-ledger`: the verdict, and with `keys` every key the ledger took written there.
pub async fn check(
    url: &str,
    json: bool,
    keys: Option<&std::path::Path>,
) -> Result<ExitCode, Error> {
    let counts = fetch(url).await?;
    if let Some(path) = keys {
        let listed = fetch_keys(url).await?;
        std::fs::write(path, &listed).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(report(&counts, json))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `method` on `path`, with an `Idempotency-Key` if `key`: the status and the body.
    async fn send(
        addr: SocketAddr,
        method: Method,
        path: &str,
        key: Option<&str>,
    ) -> (StatusCode, Bytes) {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, addr.to_string());
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        let res = sender.send_request(req.body(Full::new(Bytes::from_static(b"{}"))).unwrap());
        let res = res.await.unwrap();
        let status = res.status();
        (status, res.into_body().collect().await.unwrap().to_bytes())
    }

    async fn post(addr: SocketAddr, key: Option<&str>) -> StatusCode {
        let (status, body) = send(addr, Method::POST, "/orders", key).await;
        assert_eq!(&body[..], b"{\"success\":true}");
        status
    }

    #[tokio::test]
    async fn ledger_counts_and_names_keys_forwarded_twice() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_on(listener));
        for key in [Some("a"), Some("b"), Some("a"), None, Some("c"), Some("a")] {
            assert_eq!(post(addr, key).await, StatusCode::OK);
        }
        // Only a POST is an order, and only a GET of /ledger the counts.
        let (status, _) = send(addr, Method::GET, "/orders", Some("a")).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        let counts = fetch(&format!("http://{addr}/ledger")).await.unwrap();
        assert_eq!(counts.total, 6);
        assert_eq!(counts.unique, 3);
        assert_eq!(counts.missing_key, 1);
        assert_eq!(counts.duplicates, vec!["a".to_string()]);
        assert_eq!(report(&counts, true), ExitCode::from(1));
        // Every key it took, for a replay.
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        let url = format!("http://{addr}/ledger");
        assert_eq!(
            check(&url, true, Some(&keys)).await.unwrap(),
            ExitCode::from(1)
        );
        assert_eq!(std::fs::read_to_string(&keys).unwrap(), "a\nb\nc\n");
        server.abort();
    }

    /// A trade sent without a key, forwarded again under the next minute's fingerprint
    /// within a minute of the first, is a double (the gateway holds a fingerprint 60 s
    /// whatever its minute); a minute later it is a new trade. Counted once either way.
    #[test]
    fn a_fingerprint_forwarded_again_within_its_minute_is_a_double() {
        let mut book = Book::default();
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        book.take("trade:x:BTC:LONG:1:live:100".into(), at(0));
        book.take("trade:x:BTC:LONG:1:live:101".into(), at(20));
        book.take("trade:x:ETH:LONG:1:live:100".into(), at(0));
        book.take("trade:x:ETH:LONG:1:live:102".into(), at(61));
        book.take("trade:x:SOL:LONG:1:live:100".into(), at(0));
        book.take("trade:x:SOL:LONG:1:live:100".into(), at(1));
        book.take("client:psk:live:100".into(), at(0));
        let counts = book.counts();
        assert_eq!(counts.total, 7);
        assert_eq!(
            counts.duplicates,
            ["trade:x:BTC:LONG:1:live:101", "trade:x:SOL:LONG:1:live:100"]
        );
        assert_eq!(report(&counts, true), ExitCode::from(1));
    }

    #[test]
    fn the_keys_are_listed_on_the_ledgers_own_host() {
        assert_eq!(
            keys_url("http://ledger:9000/ledger").unwrap(),
            "http://ledger:9000/ledger/keys"
        );
        assert!(keys_url("/ledger").is_err());
    }

    #[test]
    fn an_order_without_a_key_fails_the_check() {
        let counts = Counts {
            total: 3,
            unique: 2,
            missing_key: 1,
            ..Counts::default()
        };
        assert_eq!(report(&counts, true), ExitCode::from(1));
        assert_eq!(report(&counts, false), ExitCode::from(1));
    }

    #[test]
    fn no_duplicates_is_success() {
        let counts = Counts {
            total: 2,
            unique: 2,
            ..Counts::default()
        };
        assert_eq!(report(&counts, true), ExitCode::SUCCESS);
    }
}
