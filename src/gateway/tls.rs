//! rustls server configuration: TLS 1.2 and 1.3 only, HTTP/2 and HTTP/1.1 by ALPN, the
//! ring provider, optional client certificates (mTLS), and self-signed certificates for the
//! first run.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::{RootCertStore, ServerConfig};

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

/// A loaded TLS configuration, with its client verifier (mTLS) kept beside it: rustls does
/// not hand it back, and a reload checks the clients of connections already open against
/// the new one ([`Tls::still_trusts`]).
pub struct Tls {
    pub config: Arc<ServerConfig>,
    clients: Option<Arc<dyn ClientCertVerifier>>,
    /// The served certificate's dates, unix seconds (`None` if they cannot be read: rustls
    /// serves what it can, and the clients judge).
    pub validity: Option<Validity>,
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
    fn of(cert: &CertificateDer<'_>) -> Option<Validity> {
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
        let v = parsed.validity();
        Some(Validity {
            not_before: v.not_before.timestamp(),
            not_after: v.not_after.timestamp(),
        })
    }

    /// What an operator must hear of these dates at `now` (unix seconds), of the
    /// certificate in `cert`: expired, not yet valid, or ending within 14 days. Said at
    /// start, at each reload and by `check-config`; not a refusal, for a client that skips
    /// the dates (`curl -k`) is still served, and a box without a clock battery may boot
    /// with its clock behind.
    pub fn warning(&self, cert: &Path, now: i64) -> Option<String> {
        let date = |t: i64| {
            x509_parser::time::ASN1Time::from_timestamp(t)
                .ok()
                .and_then(|t| t.to_rfc2822().ok())
                .unwrap_or_else(|| format!("unix time {t}"))
        };
        let cert = cert.display();
        if now < self.not_before {
            Some(format!(
                "{cert}: the certificate is not valid before {} (or this host's clock is \
                 behind): clients that check dates refuse it until then",
                date(self.not_before)
            ))
        } else if now >= self.not_after {
            Some(format!(
                "{cert}: the certificate expired on {}: clients that check dates refuse \
                 every connection; renew it and reload",
                date(self.not_after)
            ))
        } else if self.not_after - now < EXPIRES_SOON_S {
            let left = self.not_after - now;
            let left = match left / 86_400 {
                0 => format!("{} hour(s)", left / 3600),
                days => format!("{days} day(s)"),
            };
            Some(format!(
                "{cert}: the certificate expires on {}, in {left}: renew it and reload",
                date(self.not_after),
            ))
        } else {
            None
        }
    }
}

/// The unix second at which the first certificate of `chain` expires, `None` if a date
/// cannot be read (the verifier, which read it, judges then).
pub fn valid_until(chain: &[CertificateDer<'_>]) -> Option<i64> {
    chain
        .iter()
        .map(|c| Validity::of(c).map(|v| v.not_after))
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .min()
}

impl Tls {
    /// The served certificate's dates, said now if clients refuse it or soon will
    /// ([`Validity::warning`]); `cert` is the file it came from, for the message.
    pub fn date_warning(&self, cert: &Path) -> Option<String> {
        let now = crate::mutex::clock::unix_s();
        self.validity.and_then(|v| v.warning(cert, now))
    }

    /// Whether a client certificate chain (end entity first), verified at a handshake under
    /// an earlier configuration, verifies under this one. False when this one verifies no
    /// client at all.
    pub fn still_trusts(&self, chain: &[CertificateDer<'static>]) -> bool {
        match (&self.clients, chain.split_first()) {
            (Some(v), Some((end, intermediates))) => v
                .verify_client_cert(end, intermediates, UnixTime::now())
                .is_ok(),
            _ => false,
        }
    }
}

impl TlsFiles {
    pub fn load(&self) -> Result<Arc<Tls>, TlsError> {
        // Here, so that a reload refuses a key made world-readable since the start.
        crate::secrets::refuse_world_readable(&self.key)?;
        let read = |role, path: &Path| {
            crate::secrets::read_regular(path).map_err(|e| file_err(role, path, e))
        };
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(&read(Role::Cert, &self.cert)?)
                .collect::<Result<_, _>>()
                .map_err(|e| file_err(Role::Cert, &self.cert, e))?;
        let Some(leaf) = chain.first().cloned() else {
            return Err(file_err(
                Role::Cert,
                &self.cert,
                "no certificate in PEM file",
            ));
        };
        let key = PrivateKeyDer::from_pem_slice(&read(Role::Key, &self.key)?).map_err(|e| match e {
            // Found none, or read OpenSSL's `Proc-Type` header as bad base64.
            _ if encrypted(&self.key) => file_err(
                Role::Key,
                &self.key,
                "the private key is encrypted, and the gateway starts unattended: decrypt \
                 it (openssl pkey -in key.pem -out key.pem) and keep the file private",
            ),
            rustls::pki_types::pem::Error::NoItemsFound => file_err(
                Role::Key,
                &self.key,
                "no private key in PEM file (a BEGIN PRIVATE KEY block; is it the certificate?)",
            ),
            e => file_err(Role::Key, &self.key, e),
        })?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let (builder, clients) = match &self.client_ca {
            None => (builder.with_no_client_auth(), None),
            Some(ca) => {
                if let Some(why) = crate::secrets::open_to_writes(ca) {
                    return Err(file_err(Role::ClientCa, ca, why));
                }
                let mut roots = RootCertStore::empty();
                for c in CertificateDer::pem_slice_iter(&read(Role::ClientCa, ca)?) {
                    roots
                        .add(c.map_err(|e| file_err(Role::ClientCa, ca, e))?)
                        .map_err(|e| file_err(Role::ClientCa, ca, e))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()
                        .map_err(|e| file_err(Role::ClientCa, ca, e))?;
                (
                    builder.with_client_cert_verifier(verifier.clone()),
                    Some(verifier),
                )
            }
        };
        let mut cfg = builder.with_single_cert(chain, key).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => file_err(
                Role::Key,
                &self.key,
                format!("does not match the certificate in {}", self.cert.display()),
            ),
            e => file_err(Role::Key, &self.key, e),
        })?;
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
            validity: Validity::of(&leaf),
        }))
    }
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

/// Whether the PEM file at `path` holds an encrypted private key (PKCS#8's `ENCRYPTED
/// PRIVATE KEY`, or OpenSSL's `Proc-Type: 4,ENCRYPTED` header), which no parser here reads.
fn encrypted(path: &Path) -> bool {
    let text = std::fs::read(path).unwrap_or_default();
    let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
    has(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") || has(b"Proc-Type: 4,ENCRYPTED")
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
        let said = |now| v.warning(&files.cert, now);
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
        std::fs::copy(dir.path().join("cert.pem"), &ca).unwrap();
        assert!(bad.load().is_ok());
        std::fs::set_permissions(&ca, std::os::unix::fs::PermissionsExt::from_mode(0o646)).unwrap();
        let e = bad.load().err().expect("refused").to_string();
        assert!(
            e.contains("ca.pem") && e.contains("writable by everyone"),
            "{e}"
        );
    }
}
