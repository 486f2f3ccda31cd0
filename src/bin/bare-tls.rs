//! bare-tls: the benchmark baseline. The same TLS face as the gateway (rustls with the ring
//! provider, TLS 1.2 and 1.3, ALPN h2 + http/1.1, the same certificate) and the same hyper 1
//! server, but no work behind it: every POST gets `200 {"success":true}` once its body is read.
//! Whatever the gateway costs on top of this is the price of the mutex, the auth and the parse.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

#[derive(Parser)]
#[command(about = "Bare hyper + rustls server: the baseline for scripts/bench.sh")]
struct Args {
    /// Address to listen on (loopback for benchmarks).
    #[arg(long, default_value = "127.0.0.1:8444")]
    listen: SocketAddr,
    /// PEM certificate chain.
    #[arg(long)]
    cert: PathBuf,
    /// PEM private key.
    #[arg(long)]
    key: PathBuf,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

fn tls_config(cert: &PathBuf, key: &PathBuf) -> Result<rustls::ServerConfig, Error> {
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: {e}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    // The key's path may be named; its content never is.
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|_| format!("{}: no usable private key", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    if req.method() != Method::POST {
        let mut res = Response::new(Full::new(Bytes::new()));
        *res.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        return Ok(res);
    }
    // Read the whole body, as the gateway must before it can parse the trade.
    req.into_body().collect().await?;
    let mut res = Response::new(Full::new(Bytes::from_static(b"{\"success\":true}")));
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(res)
}

fn main() -> Result<(), Error> {
    // The gateway's allocator, before the runtime's threads allocate: a fair baseline.
    hoox_edge::platform::alloc::tune();
    serve()
}

#[tokio::main]
async fn serve() -> Result<(), Error> {
    let args = Args::parse();
    let acceptor = TlsAcceptor::from(Arc::new(tls_config(&args.cert, &args.key)?));
    let listener = TcpListener::bind(args.listen).await?;
    println!("bare-tls: listening on {}", listener.local_addr()?);
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(conn) => conn,
            // Out of descriptors and the like: keep serving the connections we have.
            Err(e) => {
                eprintln!("bare-tls: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(answer);
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}
