//! Throwaway certificates: a CA, a server certificate for loopback, and client certificates for
//! mTLS, written as PEM files (mode 0600, as a real deployment keeps its keys).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate and its private key on disk.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A private CA in a directory, and the server certificate it signed.
pub struct Pki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate: what clients trust, and what the server's `client_ca` names.
    pub ca_cert: PathBuf,
    /// For `localhost`, 127.0.0.1 and ::1.
    pub server: CertFiles,
}

impl Pki {
    /// A fresh CA named `name` (two `Pki`s never trust each other) with its server certificate,
    /// written into `dir` as `<name>-ca.pem`, `<name>-server.pem`, `<name>-server.key`.
    pub fn new(dir: &Path, name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca_cert = dir.join(format!("{name}-ca.pem"));
        write_private(&ca_cert, &ca.pem());

        let mut pki = Pki {
            dir: dir.to_owned(),
            ca,
            ca_cert,
            server: CertFiles {
                cert: PathBuf::new(),
                key: PathBuf::new(),
            },
        };
        pki.server = pki.issue(
            &format!("{name}-server"),
            &["localhost", "127.0.0.1", "::1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        pki
    }

    /// A client certificate with common name `cn`, signed by this CA, as
    /// `<cn>.pem` / `<cn>.key`.
    pub fn client(&self, cn: &str) -> CertFiles {
        self.issue(cn, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A client certificate with no common name, only `name` in its subjectAltName (an
    /// IP address if it reads as one, else a DNS name), as `<name>.pem` / `<name>.key`.
    pub fn client_san_only(&self, name: &str) -> CertFiles {
        self.issue("", &[name], ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A client certificate that names nobody: no common name, no subjectAltName, as
    /// `<stem>.pem` / `<stem>.key`.
    pub fn client_nameless(&self, stem: &str) -> CertFiles {
        self.issue_as(stem, "", &[], ExtendedKeyUsagePurpose::ClientAuth, |_| {})
    }

    /// A client certificate with common name `cn` that expires at `not_after`.
    pub fn client_until(&self, cn: &str, not_after: time::OffsetDateTime) -> CertFiles {
        self.issue_as(cn, cn, &[], ExtendedKeyUsagePurpose::ClientAuth, |p| {
            p.not_after = not_after
        })
    }

    /// `cn` empty: no common name (the files are then named after the first of `names`).
    fn issue(&self, cn: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> CertFiles {
        let stem = if cn.is_empty() { names[0] } else { cn };
        self.issue_as(stem, cn, names, usage, |_| {})
    }

    /// As `<stem>.pem` / `<stem>.key`, the parameters then changed by `adjust`.
    fn issue_as(
        &self,
        stem: &str,
        cn: &str,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> CertFiles {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        // rcgen's default subject is a common name of its own: replace it.
        params.distinguished_name = rcgen::DistinguishedName::new();
        if !cn.is_empty() {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        adjust(&mut params);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &*self.ca).unwrap();
        let files = CertFiles {
            cert: self.dir.join(format!("{stem}.pem")),
            key: self.dir.join(format!("{stem}.key")),
        };
        write_private(&files.cert, &cert.pem());
        write_private(&files.key, &key.serialize_pem());
        files
    }
}

fn write_private(path: &Path, pem: &str) {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    file.write_all(pem.as_bytes()).unwrap();
}
