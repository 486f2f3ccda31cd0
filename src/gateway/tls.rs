//! rustls server configuration: TLS 1.2 and 1.3 only, HTTP/2 and HTTP/1.1 by ALPN, the
//! ring provider, optional client certificates (mTLS), and self-signed certificates for the
//! first run.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{InconsistentKeys, RootCertStore, ServerConfig};
use x509_parser::certificate::X509Certificate;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file that could not be used, and which of the three it was: one path may be given
    /// for two of them (the key as the certificate), and the error names the one at fault.
    #[error("{path}: {message}")]
    File {
        role: Role,
        path: String,
        message: String,
    },
    /// The private key or the client CA is open to others (readable, or in a folder they
    /// may write), or could not be checked.
    #[error("{0}")]
    Key(#[from] crate::secrets::SecretError),
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("certificate generation: {0}")]
    Generate(String),
}

/// Which of the TLS files an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Cert,
    Key,
    ClientCa,
}

fn file_err(role: Role, path: &Path, message: impl ToString) -> TlsError {
    TlsError::File {
        role,
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// Where the certificate, key and optional client CA live. Loaded at start and again on
/// SIGHUP; a failed reload keeps the running configuration.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// The crypto provider, named once: ring, as the project chose.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why a private key that parsed cannot sign: its kind, or, when the system's random
/// source failed as well (`random` false), that, which loading a key needs. r34 found a
/// failing getrandom reported as a key of the wrong kind, sending the operator to a file
/// that was fine.
fn unusable_key(random: bool) -> &'static str {
    if random {
        "a key of a kind the gateway cannot sign with: it takes RSA (2048 to 4096 bits), \
         ECDSA P-256 or P-384, or Ed25519; not P-521, RSA-PSS, or RSA under 2048 or over \
         4096 bits"
    } else {
        "cannot be loaded: the system's random source failed (getrandom, and /dev/urandom \
         where that is refused), and loading a key needs it; the key may be fine: look for \
         what keeps the process from it (a chroot or container without /dev/urandom, a \
         system call filter)"
    }
}

/// A loaded TLS configuration, with its client verifier (mTLS) kept beside it: rustls does
/// not hand it back, and a reload checks the clients of connections already open against
/// the new one ([`Tls::still_trusts`]).
pub struct Tls {
    pub config: Arc<ServerConfig>,
    clients: Option<Arc<dyn ClientCertVerifier>>,
    /// When the served certificate is valid, unix seconds (`None` if its dates cannot be
    /// read: rustls serves what it can, and the clients judge). The leaf's: a chain may
    /// carry an expired cross-signed root that clients never reach, stopping at the root
    /// they trust, and the expiry alert would fire for good. [`Tls::warnings`] names the
    /// chain's others.
    pub validity: Option<Validity>,
    /// The served chain, leaf first, for [`Tls::warnings`].
    chain: Vec<CertificateDer<'static>>,
}

/// When the served certificate is valid: rustls serves an expired one without a word, and
/// every client that checks dates then refuses the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

/// How long before its end a certificate is said to expire soon.
const EXPIRES_SOON_S: i64 = 14 * 24 * 3600;

impl Validity {
    fn of(cert: &X509Certificate<'_>) -> Validity {
        let v = cert.validity();
        Validity {
            not_before: v.not_before.timestamp(),
            not_after: v.not_after.timestamp(),
        }
    }

    /// What an operator must hear of these dates at `now` (unix seconds), of the
    /// certificate `which` names: expired, not yet valid, or ending within 14 days. Said at
    /// start, at each reload and by `check-config`; not a refusal, for a client that skips
    /// the dates (`curl -k`) is still served, and a box without a clock battery may boot
    /// with its clock behind.
    ///
    /// `who` refuses it: "clients that check dates" for the server's own; for one further
    /// down its chain, those that need it to reach a root they trust.
    pub fn warning(&self, which: &str, who: &str, now: i64) -> Option<String> {
        let date = |t: i64| {
            x509_parser::time::ASN1Time::from_timestamp(t)
                .ok()
                .and_then(|t| t.to_rfc2822().ok())
                .unwrap_or_else(|| format!("unix time {t}"))
        };
        if now < self.not_before {
            Some(format!(
                "{which} is not valid before {} (or this host's clock is behind): {who} \
                 refuse it until then",
                date(self.not_before)
            ))
        } else if now >= self.not_after {
            Some(format!(
                "{which} expired on {}: {who} refuse every connection; renew it and \
                 reload",
                date(self.not_after)
            ))
        } else if self.not_after - now < EXPIRES_SOON_S {
            let left = self.not_after - now;
            let left = match left / 86_400 {
                0 => format!("{} hour(s)", left / 3600),
                days => format!("{days} day(s)"),
            };
            Some(format!(
                "{which} expires on {}, in {left}: renew it and reload",
                date(self.not_after),
            ))
        } else {
            None
        }
    }
}

/// The unix second after which a client's `chain`, verified in a handshake that began at
/// `began` (unix seconds), must be verified again: the earliest end date among its
/// certificates. A client may send certificates the verifier never uses, and two kinds
/// are passed over. One that cannot be read must not hide the others' dates (it once kept
/// an expired certificate placing orders until the next reload). One that had expired
/// before the handshake began was not on the path the verifier accepted (a stale
/// cross-signed CA, commonly): counted, it had every request of the connection verified
/// again, path building and signatures, for as long as it stayed open. The client's own,
/// unread, is `i64::MIN`: verified at each request, by the verifier, which read it.
pub fn valid_until(chain: &[CertificateDer<'_>], began: i64) -> i64 {
    let Some(leaf) = chain.first().and_then(parse) else {
        return i64::MIN;
    };
    chain[1..]
        .iter()
        .filter_map(parse)
        .map(|c| Validity::of(&c).not_after)
        .filter(|&end| end >= began)
        .fold(Validity::of(&leaf).not_after, i64::min)
}

fn parse<'a>(cert: &'a CertificateDer<'_>) -> Option<X509Certificate<'a>> {
    x509_parser::parse_x509_certificate(cert.as_ref())
        .ok()
        .map(|(_, c)| c)
}

/// Whether a certificate may stand as an issuer in `client_ca`: a CA's, or a self-signed
/// X.509 v1 one (no extensions at all: a root made by `openssl x509 -req -signkey`). A v1
/// certificate a CA issued is a client's own (`openssl x509 -req -CA` makes v1 ones too):
/// as an anchor, its key could issue one under any client's name.
fn may_issue(cert: &X509Certificate<'_>) -> bool {
    let v1_root =
        cert.version() == x509_parser::x509::X509Version::V1 && cert.issuer() == cert.subject();
    v1_root || is_ca(cert)
}

/// Whether a certificate says it is a CA's (basicConstraints CA:TRUE).
fn is_ca(cert: &X509Certificate<'_>) -> bool {
    cert.basic_constraints()
        .ok()
        .flatten()
        .is_some_and(|b| b.value.ca)
}

impl Tls {
    /// What an operator must hear of the served chain now, `cert` the file it came from:
    /// a certificate of it out of its dates, or ending within 14 days
    /// ([`Validity::warning`]); and a server certificate that clients which verify refuse
    /// whatever its dates: a CA's, one issued for other uses than a server's
    /// (extendedKeyUsage without serverAuth), one whose issuer the chain leaves out while
    /// sending others, or one naming the server by its common name alone. Warnings, not
    /// refusals: a client that verifies nothing (`curl -k`) is served, and
    /// rustls serves them all without a word, while `/readyz` says ready and every
    /// handshake fails, logged at debug only.
    pub fn warnings(&self, cert: &Path) -> Vec<String> {
        let now = crate::mutex::clock::unix_s();
        let mut said = Vec::new();
        for (i, c) in self.chain.iter().enumerate() {
            let Some(c) = parse(c) else { continue };
            if i > 0 {
                // Clients that trust a certificate before it in the chain never reach it
                // (an old cross-signed root): said, but as what it may be.
                let which = format!("certificate {} of its chain ({})", i + 1, c.subject());
                let who = "clients that need it to reach a root they trust";
                said.extend(Validity::of(&c).warning(&which, who, now).map(|w| {
                    format!("{w} (a cross-signed root no client needs: take it out of the file)")
                }));
                continue;
            }
            let who = "clients that check dates";
            said.extend(Validity::of(&c).warning("the certificate", who, now));
            if is_ca(&c) {
                said.push(
                    "the certificate is a CA's (basicConstraints CA:TRUE, which `openssl req \
                     -x509` sets by default): clients built on rustls or Go refuse it as a \
                     server's; serve one issued for this server (`hoox-edge gen-cert` makes a \
                     self-signed one)"
                        .into(),
                );
            }
            // A certificate issued for other uses (a client's, say, from the CA that
            // issues `client_ca`'s): rustls, Go, OpenSSL and browsers all refuse one whose
            // extendedKeyUsage leaves serverAuth out, with an alert ("unsupported
            // certificate") that names no cause. No extendedKeyUsage at all is fine.
            // anyExtendedKeyUsage stands for serverAuth to Go alone: rustls (webpki) and
            // OpenSSL look for serverAuth itself, and refuse one that has only `any`.
            if let Ok(Some(eku)) = c.extended_key_usage()
                && !eku.value.server_auth
            {
                said.push(if eku.value.any {
                    "the certificate's extendedKeyUsage leaves out serverAuth, with \
                     anyExtendedKeyUsage in its place: clients built on rustls or OpenSSL \
                     (curl) refuse it as a server's, Go alone takes it; serve one whose \
                     extendedKeyUsage names serverAuth (`hoox-edge gen-cert` makes a \
                     self-signed one)"
                        .into()
                } else {
                    "the certificate's extendedKeyUsage leaves out serverAuth (it was issued \
                     for other uses, such as a client's): clients that verify (rustls, Go, \
                     OpenSSL, browsers) refuse it as a server's; serve one issued for TLS \
                     servers (`hoox-edge gen-cert` makes a self-signed one)"
                        .into()
                });
            }
            // The certificates after the server's are there for clients to reach a root
            // through. When none of them issued it (an intermediate kept from before the
            // CA changed its own, as Let's Encrypt does between R10 and R11, pasted beside
            // a renewed certificate), a client that does not hold its issuer already
            // refuses the handshake (rustls, Go and curl do), while rustls serves it
            // without a word. Names compared byte for byte, as those clients match them;
            // a chain with one this cannot read is not judged, nor a self-signed server
            // certificate, which its clients hold as it is.
            let rest: Option<Vec<_>> = self.chain.iter().skip(1).map(parse).collect();
            if let Some(rest) = rest
                && let Some(next) = rest.first()
                && c.issuer().as_raw() != c.subject().as_raw()
                && !rest
                    .iter()
                    .any(|o| o.subject().as_raw() == c.issuer().as_raw())
            {
                said.push(format!(
                    "certificate 2 of its chain ({}) did not issue the server's (issued by \
                     {}), nor did any after it: clients that do not already hold that issuer \
                     refuse the certificate; put the server's certificate first, then the \
                     intermediate that issued it (certbot's fullchain.pem)",
                    next.subject(),
                    c.issuer()
                ));
            }
            if !matches!(c.subject_alternative_name(), Ok(Some(_))) {
                said.push(
                    "the certificate names this server by its common name alone (no \
                     subjectAltName): clients that check names (rustls, Go, browsers) refuse \
                     it; reissue it with the names senders use as subjectAltNames \
                     (`hoox-edge gen-cert --name ...`)"
                        .into(),
                );
            }
        }
        let cert = cert.display();
        said.into_iter().map(|w| format!("{cert}: {w}")).collect()
    }

    /// Whether a client certificate chain (end entity first), verified at a handshake under
    /// an earlier configuration, verifies under this one. False when this one verifies no
    /// client at all. No chain (a connection made without a certificate) is trusted only
    /// where none is asked for: `client_ca` added by a reload refuses it, as a new
    /// handshake without one would be.
    pub fn still_trusts(&self, chain: &[CertificateDer<'static>]) -> bool {
        match (&self.clients, chain.split_first()) {
            (Some(v), Some((end, intermediates))) => v
                .verify_client_cert(end, intermediates, UnixTime::now())
                .is_ok(),
            (None, None) => true,
            _ => false,
        }
    }
}

impl TlsFiles {
    pub fn load(&self) -> Result<Arc<Tls>, TlsError> {
        // Here, so that a reload refuses a key made world-readable since the start.
        crate::secrets::refuse_world_readable(&self.key)?;
        let chain =
            read_certificates(&self.cert).map_err(|m| file_err(Role::Cert, &self.cert, m))?;
        let signer = self.private_key()?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let clients = self.client_ca.as_deref().map(client_verifier).transpose()?;
        let builder = match &clients {
            None => builder.with_no_client_auth(),
            Some(verifier) => builder.with_client_cert_verifier(verifier.clone()),
        };
        // The key loaded once, here, and served as loaded: `with_single_cert` would load it
        // again, a second draw on the random source with a vaguer error of its own.
        let certified = CertifiedKey::new(chain.clone(), signer.clone());
        match certified.keys_match() {
            // A key whose public half cannot be told (none of ring's) is served, as rustls
            // itself would: the handshake shows a mismatch.
            Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(_)) => return Err(self.mismatch(&chain, &*signer)),
            Err(e) => return Err(file_err(Role::Cert, &self.cert, e)),
        }
        let mut cfg = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        if clients.is_some() {
            // A resumed session is not verified again: rustls restores the client's
            // certificate from it. An expired certificate (or one a reload has taken
            // out) then kept placing orders for as long as its client kept resuming, each
            // resumption bringing new tickets. With client certificates, every
            // connection makes a full handshake; a sender keeps its connections open.
            cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
            cfg.send_tls13_tickets = 0;
        }
        Ok(Arc::new(Tls {
            config: Arc::new(cfg),
            clients,
            validity: chain.first().and_then(parse).map(|c| Validity::of(&c)),
            chain,
        }))
    }

    /// What ring signs with, from the key file: a key of a kind ring cannot use is said as
    /// such, not as a key that would not parse, nor as one of the wrong kind when it is the
    /// random source that failed ([`unusable_key`]).
    fn private_key(&self) -> Result<Arc<dyn rustls::sign::SigningKey>, TlsError> {
        let pem = read_pem(&self.key).map_err(|m| file_err(Role::Key, &self.key, m))?;
        let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
            let message = match e {
                // Found none, or read OpenSSL's `Proc-Type` header as bad base64.
                _ if encrypted(&pem) => "the private key is encrypted, and the gateway \
                    starts unattended: decrypt it (openssl pkey -in key.pem -out key.pem) and \
                    keep the file private"
                    .to_string(),
                pem::Error::NoItemsFound if !der(&pem) => "no private key in PEM file (a \
                    BEGIN PRIVATE KEY block; is it the certificate?)"
                    .to_string(),
                e => pem_error(
                    &e,
                    &pem,
                    "private key",
                    "openssl pkey -inform der -in FILE -out FILE.pem, then chmod 0600 FILE.pem",
                ),
            };
            file_err(Role::Key, &self.key, message)
        })?;
        // ring draws random bytes to load an ECDSA key: a getrandom that failed once is
        // tried again; where the random source fails for good, the key itself is not at
        // fault, and the error says so.
        let provider = provider();
        let load = || provider.key_provider.load_private_key(key.clone_key());
        load().or_else(|_| load()).map_err(|_| {
            let random = provider.secure_random.fill(&mut [0u8; 1]).is_ok();
            file_err(Role::Key, &self.key, unusable_key(random))
        })
    }

    /// The key does not match the chain's first certificate: said, and if it matches one
    /// further down, that the chain is out of order.
    fn mismatch(
        &self,
        chain: &[CertificateDer<'_>],
        signer: &dyn rustls::sign::SigningKey,
    ) -> TlsError {
        let cert = self.cert.display();
        let spki = signer.public_key();
        let at = chain.iter().position(|c| {
            parse(c).map(|c| c.tbs_certificate.subject_pki.raw) == spki.as_ref().map(|k| k.as_ref())
        });
        let m = match at {
            Some(i) => format!(
                "matches certificate {} in {cert}, not the first: the server's own \
                 certificate comes first, then its intermediates",
                i + 1
            ),
            None => format!("does not match the certificate in {cert}"),
        };
        file_err(Role::Key, &self.key, m)
    }
}

/// The verifier of client certificates issued by the CAs in `ca` (`server.client_ca`).
fn client_verifier(ca: &Path) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let bad = |m| file_err(Role::ClientCa, ca, m);
    if let Some(why) = crate::secrets::open_to_writes(ca, "a CA") {
        return Err(bad(why));
    }
    let mut roots = RootCertStore::empty();
    for (i, c) in read_certificates(ca).map_err(bad)?.into_iter().enumerate() {
        // A trust anchor is a name and a key, whatever the certificate says: a client's
        // own certificate here would let its key issue one under any client's name, and
        // webpki would take it.
        if let Some(c) = parse(&c).filter(|c| !may_issue(c)) {
            return Err(bad(format!(
                "certificate {} ({}) is not a CA's (no basicConstraints CA:TRUE): client_ca \
                 names the CAs that issue client certificates, and a client's own certificate \
                 there would let its key issue one under any client's name; a CA of your own \
                 made without it can be signed again with the same key and subject, as a \
                 CA's (openssl x509 -extfile with basicConstraints=critical,CA:TRUE)",
                i + 1,
                c.subject()
            )));
        }
        roots.add(c).map_err(|e| bad(e.to_string()))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| bad(e.to_string()))
}

/// The name a verified client certificate goes by: its subject's common name, or, for a
/// certificate without one (current practice puts names only in the subjectAltName), the
/// first DNS name there, else the first URI, else the first email address, else the first
/// IP address (what a machine on a LAN is often certified by). A CN and a DNS name that
/// read alike are one client: the CA that signed both meant one name. `None` for a
/// certificate that names nobody: the caller refuses it, for two such clients could not
/// be told apart.
pub fn client_name(cert: &CertificateDer<'_>) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    // An empty CN, or one in an encoding x509-parser does not decode, names nobody: the
    // subjectAltName may still.
    let cn = parsed.subject().iter_common_name().next();
    if let Some(cn) = cn
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
    {
        return Some(cn.to_owned());
    }
    let san = parsed.subject_alternative_name().ok()??;
    // The first of the best kind: `min_by_key` keeps the first of equals.
    let (_, name) = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match *n {
            GeneralName::DNSName(s) => Some((0, s.to_owned())),
            GeneralName::URI(s) => Some((1, s.to_owned())),
            GeneralName::RFC822Name(s) => Some((2, s.to_owned())),
            GeneralName::IPAddress(b) => ip_address(b).map(|ip| (3, ip.to_string())),
            _ => None,
        })
        .filter(|(_, s)| !s.is_empty())
        .min_by_key(|&(rank, _)| rank)?;
    Some(name)
}

/// An iPAddress alt name: 4 bytes for IPv4, 16 for IPv6 (RFC 5280 §4.2.1.6).
fn ip_address(bytes: &[u8]) -> Option<std::net::IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        _ => None,
    }
}

/// What a self-signed certificate names when nothing else is asked: the embedded defaults',
/// `gen-cert`'s and the bench's, which senders on this host reach.
pub const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Whether PEM text holds an encrypted private key (PKCS#8's `ENCRYPTED PRIVATE KEY`, or
/// OpenSSL's `Proc-Type: 4,ENCRYPTED` header), which no parser here reads.
fn encrypted(text: &[u8]) -> bool {
    let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
    has(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") || has(b"Proc-Type: 4,ENCRYPTED")
}

/// The bytes of a PEM file, read as [`crate::secrets::read_regular`] reads (a regular
/// file, not waited on), less a UTF-8 byte order mark. openssl skips one; the PEM reader
/// took the first BEGIN line for text before the first block, and left that block unread
/// without a word: a chain's leaf (the key then said not to match), a bundle's first CA.
pub fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let mut bytes = crate::secrets::read_regular(path).map_err(|e| e.to_string())?;
    if bytes.starts_with(b"\xEF\xBB\xBF") {
        bytes.drain(..3);
    }
    Ok(bytes)
}

/// The certificates of the PEM file at `path`, in order, at least one: the served chain,
/// `server.client_ca`, `executor.ca_file`.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(&e, &pem, "certificate", CONVERT_CERT))?;
    if certs.is_empty() {
        return Err(pem_error(
            &pem::Error::NoItemsFound,
            &pem,
            "certificate",
            CONVERT_CERT,
        ));
    }
    Ok(certs)
}

const CONVERT_CERT: &str = "openssl x509 -inform der -in FILE -out FILE.pem";

/// Whether bytes look like DER (an ASN.1 SEQUENCE), not PEM text.
fn der(bytes: &[u8]) -> bool {
    bytes.first() == Some(&0x30)
}

/// A PEM reader's error in words: its own name the bytes of a line as numbers. `what` is
/// what was looked for, `convert` the command that makes one from DER.
///
/// The file's text is quoted only where it is shaped as a label (`PRIVATE KEY`) or a BEGIN
/// line: a key whose line breaks were lost (`echo $KEY > key.pem`) or escaped (`\n`, as
/// secret stores and environment variables hold it) reads as one line, so its "label" or
/// its "BEGIN line" is the whole key, and this message goes to the journal.
fn pem_error(e: &pem::Error, bytes: &[u8], what: &str, convert: &str) -> String {
    const JOINED: &str = "its BEGIN line runs on into the key or certificate itself: were \
        the file's line breaks lost or escaped? (`echo $PEM > file` joins them; \
        `printf '%s\\n' \"$PEM\" > file` keeps them)";
    match e {
        pem::Error::NoItemsFound if der(bytes) => format!(
            "no {what} in PEM form: the file looks like DER (binary); convert it: {convert}"
        ),
        pem::Error::NoItemsFound => format!("no {what} in PEM file"),
        pem::Error::MissingSectionEnd { end_marker } => match pem_text(end_marker, 40, false) {
            Some(label) => format!(
                "a PEM block is not closed: no \"-----END {label}-----\" line (is the file cut \
                 short?)"
            ),
            None => format!("a PEM block is not closed: {JOINED}"),
        },
        pem::Error::IllegalSectionStart { line } => match pem_text(line, 64, true) {
            Some(line) => format!("a PEM BEGIN line cannot be read: \"{line}\""),
            None => format!("a PEM BEGIN line cannot be read: {JOINED}"),
        },
        pem::Error::Base64Decode(m) => format!("a PEM block's base64 is damaged: {m}"),
        e => e.to_string(),
    }
}

/// `bytes` as text, if short and made only of what a PEM label is made of (capitals, digits
/// and spaces, and dashes where `dashes`): never a run of base64, which has small letters,
/// `+` and `/` (64 base64 characters without them: about one chance in 10^16).
fn pem_text(bytes: &[u8], max: usize, dashes: bool) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?.trim();
    let shaped = |c: char| c.is_ascii_uppercase() || c.is_ascii_digit() || c == ' ';
    let fits =
        (1..=max).contains(&text.len()) && text.chars().all(|c| shaped(c) || (dashes && c == '-'));
    fits.then(|| text.to_string())
}

/// Writes `cert.pem` and `key.pem` (mode 0600) into `dir`: a self-signed certificate for
/// `names` (DNS names or IP addresses), its common name the first of them. For the first run
/// and for `hoox-edge gen-cert`.
///
/// Each name must be one a TLS client can ask for: a certificate for `https://gw.lan` or
/// `gw lan` would be written, and then refused by every client that checks the name.
/// The dates are rcgen's, 1975 to 4096, on purpose: a Raspberry Pi without a real-time
/// clock boots with its clock behind until NTP answers.
pub fn generate_self_signed(dir: &Path, names: &[String]) -> Result<(), TlsError> {
    let Some(first) = names.first() else {
        return Err(TlsError::Generate("no name to certify".into()));
    };
    // A wildcard (`*.lan`) is no name a client asks for, but one a certificate may list.
    use rustls::pki_types::ServerName;
    let certifiable = |n: &str| match n.strip_prefix("*.") {
        Some(rest) => matches!(ServerName::try_from(rest), Ok(ServerName::DnsName(_))),
        None => ServerName::try_from(n).is_ok(),
    };
    if let Some(bad) = names.iter().find(|n| !certifiable(n)) {
        return Err(TlsError::Generate(format!(
            "{bad:?} is not a DNS name or an IP address"
        )));
    }
    let generate = || -> Result<_, rcgen::Error> {
        let mut params = rcgen::CertificateParams::new(names.to_vec())?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, first.as_str());
        let key = rcgen::KeyPair::generate()?;
        Ok((params.self_signed(&key)?, key))
    };
    let (cert, key) = generate().map_err(|e| TlsError::Generate(e.to_string()))?;
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    crate::config::write_private(&key_path, &key.serialize_pem())
        .map_err(|e| file_err(Role::Key, &key_path, e))?;
    crate::config::write_private(&cert_path, &cert.pem())
        .map_err(|e| file_err(Role::Cert, &cert_path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key that cannot sign is named for its kind only while the random source works;
    /// with it failing, the message says so and that the key may be fine (a failing
    /// getrandom, by strace's fault injection on the binary, was reported as a P-521 key).
    #[test]
    fn a_key_refused_for_want_of_random_bytes_is_not_called_the_wrong_kind() {
        assert!(unusable_key(true).starts_with("a key of a kind"));
        let said = unusable_key(false);
        assert!(
            said.contains("getrandom") && !said.contains("of a kind"),
            "{said}"
        );
    }

    /// A key file whose line breaks were lost or escaped reads as one line; its error names
    /// the likely cause and quotes none of the key (it went to the journal whole, as the
    /// "label" of a block not closed or as the "BEGIN line"). A label that is one is still
    /// quoted.
    #[test]
    fn a_key_file_with_its_lines_joined_is_not_quoted_in_its_error() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = key.serialize_pem();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let files = TlsFiles {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
            client_ca: None,
        };
        crate::config::write_private(&files.cert, &cert.pem()).unwrap();
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let said = |text: &str| {
            crate::config::write_private(&files.key, text).unwrap();
            match files.load() {
                Ok(_) => panic!("a broken key loaded: {text:?}"),
                Err(e) => e.to_string(),
            }
        };
        let joined = [
            pem.replace('\n', " "),                     // echo $KEY > key.pem
            pem.replace('\n', ""),                      // stripped
            pem.replace('\n', "\\n"),                   // escaped, as in JSON or env
            pem.replacen("-----\n", "----- ", 1),       // only the BEGIN line joined
            pem.replacen("KEY-----\n", "KEY----\n", 1), // a BEGIN line one dash short
        ];
        for (i, text) in joined.iter().enumerate() {
            let error = said(text);
            let leaked = (0..body.len() - 12).find(|&at| error.contains(&body[at..at + 12]));
            assert_eq!(leaked, None, "variant {i} quotes the key: {error}");
            if i < 4 {
                assert!(
                    error.contains("line breaks lost or escaped"),
                    "{i}: {error}"
                );
            } else {
                // Shaped as a BEGIN line: quoted, as it helps.
                assert!(error.contains("\"-----BEGIN PRIVATE KEY----\""), "{error}");
            }
        }
        // A block cut short: its label is quoted.
        let cut = &pem[..pem.len() / 2];
        assert!(
            said(cut).contains("no \"-----END PRIVATE KEY-----\" line (is the file cut short?)"),
            "{}",
            said(cut)
        );
    }

    /// A self-signed certificate with the common name `cn` (none if `None`) and these
    /// subjectAltNames.
    fn cert(cn: Option<&str>, sans: Vec<rcgen::SanType>) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        params.subject_alt_names = sans;
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn a_client_is_named_by_its_cn_else_its_best_alt_name() {
        use rcgen::SanType::{DnsName, IpAddress, Rfc822Name, URI};
        let dns = |s: &str| DnsName(s.try_into().unwrap());
        let uri = |s: &str| URI(s.try_into().unwrap());
        let mail = |s: &str| Rfc822Name(s.try_into().unwrap());
        let name = |cn, sans| client_name(&cert(cn, sans));
        assert_eq!(
            name(Some("desk"), vec![dns("bot.lan")]).as_deref(),
            Some("desk")
        );
        // No CN, or an empty one: the alt names, DNS before URI before email.
        assert_eq!(
            name(
                None,
                vec![mail("a@b.c"), uri("spiffe://x/y"), dns("bot.lan")]
            )
            .as_deref(),
            Some("bot.lan")
        );
        assert_eq!(
            name(Some(""), vec![mail("a@b.c"), uri("spiffe://x/y")]).as_deref(),
            Some("spiffe://x/y")
        );
        assert_eq!(name(None, vec![mail("a@b.c")]).as_deref(), Some("a@b.c"));
        // An IP address names a client too, after every other kind: a machine on a LAN is
        // often certified by nothing else.
        let ip = |s: &str| IpAddress(s.parse().unwrap());
        assert_eq!(
            name(None, vec![ip("192.168.1.20"), mail("a@b.c")]).as_deref(),
            Some("a@b.c")
        );
        assert_eq!(
            name(Some(""), vec![ip("192.168.1.20"), ip("10.0.0.1")]).as_deref(),
            Some("192.168.1.20")
        );
        assert_eq!(
            name(None, vec![ip("fd00::20")]).as_deref(),
            Some("fd00::20")
        );
        // Nothing to go by: no name, so mTLS refuses it rather than share a namespace.
        assert_eq!(name(Some(""), vec![]), None);
        assert_eq!(name(None, vec![]), None);
    }

    /// The served certificate's dates are read at load, and said when clients would refuse
    /// them: before, after, and in the last 14 days.
    #[test]
    fn a_certificate_out_of_its_dates_is_warned_of() {
        let dir = tempfile::tempdir().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2026, 1, 1);
        params.not_after = rcgen::date_time_ymd(2027, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let files = TlsFiles {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
            client_ca: None,
        };
        crate::config::write_private(&files.cert, &cert.pem()).unwrap();
        crate::config::write_private(&files.key, &key.serialize_pem()).unwrap();
        let (from, to) = (1_767_225_600, 1_798_761_600); // 2026-01-01, 2027-01-01 UTC
        let v = files.load().unwrap().validity.unwrap();
        assert_eq!((v.not_before, v.not_after), (from, to));
        let said = |now| v.warning("the certificate", "clients that check dates", now);
        assert!(
            said(from - 1)
                .unwrap()
                .contains("not valid before Thu, 01 Jan 2026")
        );
        assert_eq!(said(from), None);
        assert_eq!(said(to - EXPIRES_SOON_S), None);
        let soon = said(to - EXPIRES_SOON_S + 1).unwrap();
        assert!(
            soon.contains("expires on Fri, 01 Jan 2027 00:00:00 +0000, in 13 day(s)"),
            "{soon}"
        );
        assert!(
            said(to - 7200)
                .unwrap()
                .ends_with("in 2 hour(s): renew it and reload")
        );
        assert!(said(to).unwrap().contains("expired on Fri, 01 Jan 2027"));
    }

    /// A CA, an intermediate (its dates `inter`) and a leaf for localhost, as PEM: the
    /// chain (leaf, intermediate), the leaf's key, the CA, the intermediate alone.
    fn three_tier(inter: (i32, i32)) -> (String, String, String, String) {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let ca_params = |cn: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name.push(rcgen::DnType::CommonName, cn);
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p
        };
        let root =
            CertifiedIssuer::self_signed(ca_params("root"), KeyPair::generate().unwrap()).unwrap();
        let mut p = ca_params("inter");
        p.not_before = rcgen::date_time_ymd(inter.0, 1, 1);
        p.not_after = rcgen::date_time_ymd(inter.1, 1, 1);
        let inter = CertifiedIssuer::signed_by(p, KeyPair::generate().unwrap(), &root).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .signed_by(&key, &inter)
            .unwrap();
        (
            format!("{}{}", leaf.pem(), inter.pem()),
            key.serialize_pem(),
            root.pem(),
            inter.pem(),
        )
    }

    /// A client's chain is verified again at the earliest end date among its certificates
    /// (here the intermediate's, 2030), read past one that cannot be read (the verifier
    /// skips such an extra certificate, and it once hid every date, so an expired client
    /// went on placing orders until a reload) and past one expired before the handshake
    /// (not on the verified path; it had every request verified again).
    #[test]
    fn a_client_chain_is_checked_again_at_its_earliest_end_that_counts() {
        let pem = |chain: &str| {
            CertificateDer::pem_slice_iter(chain.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap()
        };
        let certs = pem(&three_tier((2020, 2030)).0);
        let now = crate::mutex::clock::unix_s();
        let end_2030 = 1_893_456_000;
        assert_eq!(valid_until(&certs, now), end_2030);
        // The leaf alone ends later (rcgen's default end).
        assert!(valid_until(&certs[..1], now) > end_2030);
        let junk = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00]);
        let with_junk = [certs[0].clone(), junk.clone(), certs[1].clone()];
        assert_eq!(valid_until(&with_junk, now), end_2030);
        // A stale CA sent along, ended 2010: passed over, as the handshake's path could
        // not hold it; one that ended after the handshake began counts.
        let stale = pem(&three_tier((2000, 2010)).0)[1].clone();
        let with_stale = [certs[0].clone(), stale.clone(), certs[1].clone()];
        assert_eq!(valid_until(&with_stale, now), end_2030);
        let end_2010 = 1_262_304_000;
        assert_eq!(valid_until(&with_stale, end_2010), end_2010);
        // The client's own certificate unread: verified again at each request.
        assert_eq!(valid_until(&[junk, certs[1].clone()], now), i64::MIN);
        assert_eq!(valid_until(&[], now), i64::MIN);
    }

    fn files_of(dir: &Path, cert: &str, key: &str) -> TlsFiles {
        let files = TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            client_ca: None,
        };
        crate::config::write_private(&files.cert, cert).unwrap();
        crate::config::write_private(&files.key, key).unwrap();
        files
    }

    /// A chain's certificates past the leaf are judged by their dates too: an expired
    /// intermediate is warned of, by name, as what it may be (an old cross-signed root no
    /// client reaches is harmless). The metric gives the leaf's end: such a root would have
    /// it fire for good. A certificate made by `gen-cert` is warned of for nothing.
    #[test]
    fn the_whole_chain_is_judged_by_its_dates() {
        let dir = tempfile::tempdir().unwrap();
        let (chain, key, _, _) = three_tier((2020, 2025));
        let files = files_of(dir.path(), &chain, &key);
        let tls = files.load().unwrap();
        assert_eq!(tls.validity.unwrap().not_after, 67_090_118_400); // rcgen's leaf: 4096
        let said = tls.warnings(&files.cert);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("certificate 2 of its chain (CN=inter) expired on Wed, 01 Jan 2025")
                && said[0].contains("clients that need it to reach a root they trust refuse")
                && said[0].contains("a cross-signed root no client needs: take it out"),
            "{said:?}"
        );
        let fine = dir.path().join("fine");
        std::fs::create_dir(&fine).unwrap();
        generate_self_signed(&fine, &["localhost".into()]).unwrap();
        let fine = TlsFiles {
            cert: fine.join("cert.pem"),
            key: fine.join("key.pem"),
            client_ca: None,
        };
        assert_eq!(
            fine.load().unwrap().warnings(&fine.cert),
            Vec::<String>::new()
        );
    }

    /// A chain that sends certificates past the server's, none of them its issuer (an
    /// intermediate kept from before the CA changed its own, beside a renewed certificate),
    /// is warned of: clients that do not hold the issuer refuse it. A chain holding the
    /// issuer, wherever in it, or the server's certificate alone, is not.
    #[test]
    fn a_chain_that_leaves_out_the_servers_issuer_is_warned_of() {
        let dir = tempfile::tempdir().unwrap();
        let (chain, key, root, inter) = three_tier((2020, 2090));
        let leaf = chain.strip_suffix(&inter).unwrap();
        let said = |pem: String| {
            let files = files_of(dir.path(), &pem, &key);
            files.load().unwrap().warnings(&files.cert)
        };
        // A self-signed one with a certificate after it: its clients hold it as it is.
        let self_signed = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&rcgen::KeyPair::from_pem(&key).unwrap())
            .unwrap()
            .pem();
        for fine in [
            leaf.to_string(),
            chain.clone(),
            format!("{chain}{root}"),
            format!("{leaf}{root}{inter}"),
            format!("{self_signed}{root}"),
        ] {
            assert_eq!(said(fine), Vec::<String>::new());
        }
        // The root in the intermediate's place: it issued the intermediate, not the leaf.
        let w = said(format!("{leaf}{root}"));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains(
                "certificate 2 of its chain (CN=root) did not issue the server's \
                           (issued by CN=inter)"
            ) && w[0].contains("fullchain.pem"),
            "{w:?}"
        );
    }

    /// A server certificate no verifying client takes, whatever its dates, is warned of:
    /// a CA's (what `openssl req -x509` makes), one issued for clients only
    /// (extendedKeyUsage without serverAuth: served without a word, every rustls client
    /// refused it with an alert naming no cause), and one without a subjectAltName.
    #[test]
    fn a_certificate_clients_refuse_is_warned_of() {
        use rcgen::ExtendedKeyUsagePurpose::{Any, ClientAuth, ServerAuth};
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let mut cn_only = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        cn_only
            .distinguished_name
            .push(rcgen::DnType::CommonName, "localhost");
        let with_usages = |usages| {
            let mut p = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
            p.extended_key_usages = usages;
            p
        };
        // Whether a rustls client that holds the certificate takes it as this server's.
        let rustls_takes = |cert: &rcgen::Certificate| {
            use rustls::client::danger::ServerCertVerifier;
            let mut roots = rustls::RootCertStore::empty();
            roots.add(cert.der().clone()).unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap()
                .verify_server_cert(
                    cert.der(),
                    &[],
                    &rustls::pki_types::ServerName::try_from("localhost").unwrap(),
                    &[],
                    UnixTime::now(),
                )
                .is_ok()
        };
        // A server's, among others, or with any use besides: served and taken.
        for usages in [vec![ClientAuth, ServerAuth], vec![Any, ServerAuth]] {
            let cert = with_usages(usages).self_signed(&key).unwrap();
            assert!(rustls_takes(&cert));
            let files = files_of(dir.path(), &cert.pem(), &key.serialize_pem());
            let said = files.load().unwrap().warnings(&files.cert);
            assert_eq!(said, Vec::<String>::new());
        }
        let client_only = with_usages(vec![ClientAuth]);
        // anyExtendedKeyUsage alone: Go takes it, rustls and OpenSSL refuse it.
        let any_only = with_usages(vec![Any]);
        for (params, want) in [
            (ca, "is a CA's"),
            (
                client_only,
                "extendedKeyUsage leaves out serverAuth (it was issued",
            ),
            (any_only, "with anyExtendedKeyUsage in its place"),
            (cn_only, "by its common name alone"),
        ] {
            let cert = params.self_signed(&key).unwrap();
            if want.contains("extendedKeyUsage") {
                assert!(!rustls_takes(&cert), "{want}");
            }
            let files = files_of(dir.path(), &cert.pem(), &key.serialize_pem());
            let said = files.load().unwrap().warnings(&files.cert);
            assert_eq!(said.len(), 1, "{said:?}");
            assert!(said[0].contains(want), "{said:?}");
        }
    }

    /// Files as operators have them are read, or refused saying what is wrong with them:
    /// a byte order mark, a chain in the wrong order, DER, a block cut short, a key ring
    /// cannot sign with.
    #[test]
    fn odd_files_are_read_or_refused_in_words() {
        let dir = tempfile::tempdir().unwrap();
        let (chain, key, _, inter) = three_tier((2020, 2090));
        let refused = |cert: &str, key: &str| {
            let files = files_of(dir.path(), cert, key);
            files.load().err().expect("refused").to_string()
        };
        // openssl reads past a byte order mark, and so does the gateway: the leaf is
        // served, not skipped (the key then said not to match).
        let files = files_of(dir.path(), &format!("\u{feff}{chain}"), &key);
        assert!(files.load().unwrap().warnings(&files.cert).is_empty());
        let files = files_of(dir.path(), &chain, &format!("\u{feff}{key}"));
        assert!(files.load().is_ok());
        // The intermediate first: the key is said to match the second certificate.
        let leaf = chain.strip_suffix(&inter).unwrap();
        let e = refused(&format!("{inter}{leaf}"), &key);
        assert!(e.contains("matches certificate 2 in"), "{e}");
        assert!(e.contains("not the first"), "{e}");
        // DER, for the certificate and the key.
        let der = CertificateDer::from_pem_slice(leaf.as_bytes()).unwrap();
        std::fs::write(dir.path().join("der"), der.as_ref()).unwrap();
        let files = TlsFiles {
            cert: dir.path().join("der"),
            ..files_of(dir.path(), &chain, &key)
        };
        let e = files.load().err().expect("refused").to_string();
        assert!(
            e.contains("looks like DER") && e.contains("openssl x509"),
            "{e}"
        );
        let key_der = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let files = TlsFiles {
            key: dir.path().join("key.der"),
            ..files_of(dir.path(), &chain, &key)
        };
        crate::config::write_private(&files.key, "").unwrap();
        std::fs::write(&files.key, key_der.secret_der()).unwrap();
        let e = files.load().err().expect("refused").to_string();
        assert!(
            e.contains("looks like DER")
                && e.contains("openssl pkey")
                && e.contains("then chmod 0600"),
            "{e}"
        );
        // Cut short: the line it misses, in words.
        let cut = &chain[..chain.len() / 3];
        let e = refused(cut, &key);
        assert!(
            e.contains("not closed: no \"-----END CERTIFICATE-----\" line"),
            "{e}"
        );
        // A P-521 key (a test key, made for this test): ring cannot sign with it.
        let p521 = "-----BEGIN PRIVATE KEY-----
MIHuAgEAMBAGByqGSM49AgEGBSuBBAAjBIHWMIHTAgEBBEIAIQEnJ37UKtkHaCUr
o1cMdwAIjb0kdFg+QzH8BD/0nxExQsTKYQKV7oylwOrIY2Wea3V4Js+AfwTpIv8e
C31gzM2hgYkDgYYABADykS866X0E9XAKkk4zJenpgmt+0Q/yIkqHMs3P+jGm9bzr
U+uUOtIcOBhZhNUFM9Dr03ocmq6bWYl3iX8HMCnkrwAs5L3nYjEX72jSvUYoubl6
lW25DjiZQDaK+SgEdHtU+r3aIwsFOu1ZaAW1bdzg991mAblb1opKOUpAy3gvTiym
8g==
-----END PRIVATE KEY-----
";
        let e = refused(&chain, p521);
        assert!(
            e.contains("cannot sign with") && e.contains("not P-521"),
            "{e}"
        );
        // RSA over 4096 bits (here 4104, a test key made for this test): ring signs with
        // 2048 to 4096, and the refusal says so.
        let rsa_4104 = "-----BEGIN PRIVATE KEY-----
MIIJRgIBADANBgkqhkiG9w0BAQEFAASCCTAwggksAgEAAoICAgC/Wj0EAnZgkp5q
arN/ERKERBGtIdq+46LfMMPbMBy7t/vLAhhOl5umjoz8sCQZJd1GZkrqVO1bqdje
M/qqCLs6aV5+28Uk6X2uS74DkZP1yvzER8aLNW+4wgSzK1VcOIlpt1d8A73u8kOr
VBi9SZ2I2Wziw83YsXUngd4wxENZPbSmhxOnjsGcfHzgQ/1uhlFXHV0EGpbEgITz
nFAnacSiNcn8peJLJeU+YeZasWiiuiQ4K3tesMZUxbiHGfnqETRPg6gMcafxAbJG
Bqtbl5DOer03LoEI8ppVE17LZlRig+RpcWcmZ9Rw0r5+CwUHahS9XWfxY2OhoHa1
MwoAAm+eu3zmnnAQF/fWlIW4ozXC6UW5jRXeozJ7RMw07o7k61EAuNraGNdvUMJI
uuZzI5vUtPfyjOA834IAbRyQn4o7PDZloyZdaIHAyh1whc/TybrdsMaV1MznJl/u
B+TPPhurDvyYlWjftMdwCrK+t/ow0WDTNKhfpoxPHV97gfQNZdzEfGukjr90z0Te
G3LrVkJYJoff6v4OpuJ0wQ3aQ+uI/flzW7mLh59rN+UalOH0WEwwncjZltQOMMIK
y6cxAuxR2vDYV2wP6aroznQmx2xmxFBIuMwCtcGoIaIyz7lMAqXRVF7SAKuLVHdy
MY0N1uxFpjEhU49L/W33CSgCbgSrq50CAwEAAQKCAgEBz/TjaIuP5tzUM8WgZ/xG
2nX1tLEDoiwdBiltB4xgRhWmVI5EufuZ73P4Wnr1Wma0cO6fIoNwJtVXjeKXt0Ib
yET4e/amywVDzuZq4DJjkxfZgnJxx6phjEQcPrKmj0etITTkM40aLuUIJDUhFayA
2cotPWs/g7c4cG+77u5l+zEdTc+15tjn8HYhoKKb+9sJU/meMPeV3ISZiTnB91gU
wGBSd+WDHTIigZoPLX5mdigi7pgwXJ1LWNOE6qupsG1LbWxQK9vxlz2yB6ukFQjH
DWb4fthRhSo/E3StwOscQzdqRsk+fXjqS8vDMpRAhKrnMioR4Wy9DPpEsaeJ9SNV
YrfCbRXhHtp4jAwK0JJMLE0jTVsOtIlx1SnU3h3PWeaB0o9vebgwEUF9BPvy9TlB
eTGiq6CsPaX2ocAvueEa5OwBwI6UBM0nK/0Qkm/ENQggp+MfWZ8qIDJ8rWB66gWC
caAMZAJ7GX+lzlksunWQdoRvgjq4OpTOXJcH/K3DNaFqr04o5EhU4vxPvEzZPYYM
g/xJ4u04sS491W3yhR6REE3Ewfln6KhzoVYce5JXrJ4Mj6xH2M2EHEqAWwU5erqs
wDDr0wgIKYqChu4qQ11BvNzzqLknO6qjp8LmIoGHcyaoaI+VLTWl63FFbhWl0hWa
UPcySju4Up63vUvq3jmQFYECggEBDjAU6KeQBm+9ZiIy61nQXYOovirnBjPCcUvB
569RJ1n64qoap1robdTmIqqUwX8gNbdEwKEJ5mem76l0FcjuPVtCMYgHTN6jNks/
26PNf446ISI2GIR7B+/KwQWl2f32iCtCr9Fx+tJ0OSEIeW3Rde/DKj5qrnkmEOle
QIiCPb3jqUehwbT4cBmxT94ejwnNGzMxtGHulidtkDoNKgKnp5bweWpxs1FUmkrz
VHWC10tK+ZFm+Dq2qhlub2d5qKnEuSLqxJ1ZKsoc27fI855qSYjoppQCIiJqN7c+
CEd6KI4rrYSIm/UGS7eXc38DZ1+Cb535CoElKfNF9k9pqCjumoECggEBDXyyZcvn
tN8neVnIvR5yMyXStV+UmV88nc1i7IP/2K01ggsjdQUa9MgS1yiELBtSs1kx89NS
2f3EuIKQOKvULp6lSxQkIG+o+9qm00qOdYAF6V+jZGnWjxyd85ldY2bm6A8nYRyb
OJsVR6aqpiNMZDM2Eye9T0YED2J34z5VWtxi+UqGCnjoWFx01lE7YMNxyNwQ3KHB
T3B5uF6AZsCh6IyiEKnmSfPioDcP9g9e59YhAtzzafe0g2qI/7ZsutLtB5uOwAEJ
pUq/SF7fEH63zNyG5vecHP1z0w2afPsjMWFH7JKl5SVo9aKuF8gkKhpUlx4q8IuY
MPsmc5164mhwqx0CggEBCVPI2y8Vu3WIcXW4Pgt8tY3RyLuRx/0NLsicQMF8O7+m
9Y7ZGP7l4Rbe+Rll1FPMDCRhGbaFOKkaEWM4wv2mykWNndyM2Bdh+1a7M51bgykw
xAmmwLWP4Kbfh8g7wbV5dwnhvI6YPUpQSCKUXKg61Sr8BnCkV/GjeejCIvDbltWY
rvg9uohL7/6kGBqxwl2yLtiYK7taS/K9z9yqPN0j9USA8YFuIHIuiYUOtY7PptSE
BNB3fmezIN65QJopXB3IC+KNrxa2wS/Aix4nCSozPAa61JBnWqN/awOXz3+WKsVU
p62C1eze57ZZ5f8xcKtUqCaVzDcdBJg/fW+1yWyneIECggEBBfbqklhNvVCfDWym
ePSY/oOwnqOJfRaAIS1unTh3EiTvr/YrFRpP5IcCxgJWCYd/2G8Ox0zirCMtN4gO
LfHXoVJpuT1MCMg4zEDTXEfxnociliXEhajEyX+XXt6pTUd5wJDLEohrIOp8y7Yq
a9TaeMmpFWmSsBc/vmoGqQmtB8TFRIgvpTv5TPJ+fTVpdA6bKIAiOOCUNASC4AVy
9X4lXEmtdn8cqAHibIZNWb1MdGzfJnv+bhOs0h1wPt43UZvsVVv3EnSjBmV7GI9U
SOAxerjgNA63DJ8N9P1kH/eUhccG3tmv4hncRB1QrpXFYJVKaZZe2QhzIt4/EAxK
Bwy3HwUCggEBB54rzhjvDk6JCcxeMyXLm52ZZwNUSVrpQ8wdJO6fGzLEXMY60gen
hdJpyHOfVJ5cHEQ4DMi1KJXXsL+ylGSYCLl1ZG5KHTcHnpZQn0OegUVbDKFqVKLO
I5mWBp6h68TZwSomQ/9OUyZy+wjJDMIDhxSMeXZpKbAYME4wuKTzLvcLMHaNt5Qp
2zBRJUmIQrXe3QquRQdIqedqWQE6PTR87n3As4TXXclpkcNUupMKV0Za9miCtGTI
qu7dGFWrL3tlQa7DYPUubEhzJsWwpTG9MaqbGcs7olNRvTljhMvic05Ycyvz+sZd
8lKuKpVtuXIo1FT+t3Niuhv8wyz11MxVP7M=
-----END PRIVATE KEY-----
";
        let e = refused(&chain, rsa_4104);
        assert!(
            e.contains("cannot sign with") && e.contains("RSA (2048 to 4096 bits)"),
            "{e}"
        );
    }

    /// `client_ca` takes CA certificates only: a client's own there would be a trust
    /// anchor whose key issues certificates under any client's name.
    #[test]
    fn a_client_ca_takes_ca_certificates_only() {
        let dir = tempfile::tempdir().unwrap();
        let (chain, key, root, inter) = three_tier((2020, 2090));
        let leaf = chain.strip_suffix(&inter).unwrap();
        let ca = dir.path().join("ca.pem");
        let files = TlsFiles {
            client_ca: Some(ca.clone()),
            ..files_of(dir.path(), &chain, &key)
        };
        // An X.509 v1 root (`openssl x509 -req -signkey`, no extensions): an issuer. A v1
        // certificate it issued (`openssl x509 -req -CA`) is a client's own: refused.
        let v1 = "-----BEGIN CERTIFICATE-----
MIIBHTCBwwIUJyCUAKEH09ZMqg+mLNJDkYC0F6YwCgYIKoZIzj0EAwIwEDEOMAwG
A1UEAwwFdjEtY2EwIBcNMjYxMjA1MDEzMjI1WhgPMjEyNjExMTEwMTMyMjVaMBAx
DjAMBgNVBAMMBXYxLWNhMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE/pqWU3z5
HMLihZGw8lC+bx6DVMIy5RGpl5TOfTqcMtgox0BYjzjucOjJ/bu56yRgZy0YVHAH
4HNu/+Y8R9c4oDAKBggqhkjOPQQDAgNJADBGAiEAtkm85IenS+InCwRWb+ihNSLk
S2ltS5NZ0ah/9w1YO2QCIQCtl3VN1+Lr+dgr/7CSV6EhwkQenIfftX7HegB4599I
Mg==
-----END CERTIFICATE-----
";
        let v1_client = "-----BEGIN CERTIFICATE-----
MIIBGzCBwwIUMMUzPLwBG2ujG38INnAAstZPDSswCgYIKoZIzj0EAwIwEDEOMAwG
A1UEAwwFdjEtY2EwIBcNMjYxMjA1MDE1NjUyWhgPMjEyNjExMTEwMTU2NTJaMBAx
DjAMBgNVBAMMBWFsaWNlMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEj6lTCRUq
Klw+3Frr+6kPTNmmVo01GG2pxZP+M4+q1SisAJ04hmN4U/twXiLhkqo5ZER2UZrg
JCPLMSRXCIZFnjAKBggqhkjOPQQDAgNHADBEAiB9FcutaxI8T439NxbxPeQ3/o1b
+5IAPNs4WUYMT0/RJAIgWADMt5/1MPuhhVwT7wfSo8Kw7z67WeTJ3NDvG26Ul+A=
-----END CERTIFICATE-----
";
        for (bundle, ok) in [
            (format!("{root}{inter}"), true),
            (format!("{root}{v1}"), true),
            (format!("{root}{leaf}"), false),
            (format!("{root}{v1_client}"), false),
        ] {
            std::fs::write(&ca, bundle).unwrap();
            match files.load() {
                Ok(_) => assert!(ok),
                Err(e) => {
                    assert!(!ok, "{e}");
                    let e = e.to_string();
                    assert!(
                        e.contains("certificate 2 (CN=") && e.contains("not a CA's"),
                        "{e}"
                    );
                }
            }
        }
    }

    /// The common name is the first name asked for, and the names a client checks are all
    /// there; a name no client can ask for is refused before anything is written.
    #[test]
    fn a_certificate_is_made_only_for_names_a_client_can_ask_for() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["gw.lan".to_string(), "10.0.0.7".into(), "::1".into()];
        generate_self_signed(dir.path(), &names).unwrap();
        let pem = std::fs::read(dir.path().join("cert.pem")).unwrap();
        let cert = CertificateDer::from_pem_slice(&pem).unwrap();
        assert_eq!(client_name(&cert).as_deref(), Some("gw.lan"));
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).unwrap();
        let san = parsed.subject_alternative_name().unwrap().unwrap();
        assert_eq!(san.value.general_names.len(), 3, "{san:?}");
        let wild = dir.path().join("wild");
        std::fs::create_dir(&wild).unwrap();
        generate_self_signed(&wild, &["*.lan".into()]).unwrap();
        for bad in [
            "https://gw.lan",
            "gw lan",
            "",
            "gw.lan:8443",
            "*.10.0.0.7",
            "a.*.lan",
        ] {
            let out = dir.path().join("bad");
            let e = generate_self_signed(&out, &["gw.lan".into(), bad.into()]).unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("{bad:?} is not a DNS name or an IP address")),
                "{bad}: {e}"
            );
            assert!(!out.join("key.pem").exists() && !out.join("cert.pem").exists());
        }
        assert!(generate_self_signed(dir.path(), &[]).is_err());
    }

    #[test]
    fn generated_certificate_loads() {
        let dir = tempfile::tempdir().unwrap();
        generate_self_signed(dir.path(), &["localhost".into(), "127.0.0.1".into()]).unwrap();
        let files = TlsFiles {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
            client_ca: None,
        };
        let cfg = files.load().unwrap();
        assert_eq!(cfg.config.alpn_protocols[0], b"h2");
        // Another certificate's key, and the certificate given as the key: each said so.
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        generate_self_signed(&other, &["localhost".into()]).unwrap();
        let mismatched = TlsFiles {
            key: other.join("key.pem"),
            ..files.clone()
        };
        let e = mismatched.load().err().expect("refused").to_string();
        let cert = files.cert.display();
        assert!(
            e.contains("other/key.pem")
                && e.contains(&format!("does not match the certificate in {cert}")),
            "{e}"
        );
        // An encrypted key is said to be one: the gateway starts with nobody to type its
        // passphrase.
        let locked = dir.path().join("locked.pem");
        crate::config::write_private(
            &locked,
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
        )
        .unwrap();
        let encrypted = TlsFiles {
            key: locked,
            ..files.clone()
        };
        let e = encrypted.load().err().expect("refused").to_string();
        assert!(e.contains("the private key is encrypted"), "{e}");
        // OpenSSL's older form: a header inside the block, which no base64 reads.
        crate::config::write_private(
            &encrypted.key,
            "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n\
             DEK-Info: AES-128-CBC,00112233445566778899AABBCCDDEEFF\n\nAAAA\n\
             -----END RSA PRIVATE KEY-----\n",
        )
        .unwrap();
        let e = encrypted.load().err().expect("refused").to_string();
        assert!(e.contains("the private key is encrypted"), "{e}");
        let swapped = TlsFiles {
            key: files.cert.clone(),
            ..files.clone()
        };
        let e = swapped.load().err().expect("refused").to_string();
        assert!(
            e.contains("no private key") && e.contains("certificate?"),
            "{e}"
        );
        // A client CA that is not a certificate is refused, naming the file.
        std::fs::write(dir.path().join("ca.pem"), "nope").unwrap();
        let bad = TlsFiles {
            client_ca: Some(dir.path().join("ca.pem")),
            ..files
        };
        let e = bad.load().err().expect("refused").to_string();
        assert!(e.contains("ca.pem"), "{e}");
        // A good one that anyone may write is refused too: anyone could add a CA to it.
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, three_tier((2020, 2090)).2).unwrap();
        assert!(bad.load().is_ok());
        std::fs::set_permissions(&ca, std::os::unix::fs::PermissionsExt::from_mode(0o646)).unwrap();
        let e = bad.load().err().expect("refused").to_string();
        assert!(
            e.contains("ca.pem") && e.contains("writable by everyone"),
            "{e}"
        );
    }
}
