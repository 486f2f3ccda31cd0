//! Authentication, fail closed (SPEC §3): a body `apiKey`, an HMAC-SHA256 signature, a
//! bearer token, or a client certificate. Several secrets per method, for rotation.
//!
//! Secrets are compared in constant time, and through their SHA-256 so that not even
//! their length leaks. Whatever fails, the client gets the same 401; [`AuthError`] says
//! more, for the logs only.

use std::fmt;
use std::str::FromStr;

use hmac::{Hmac, KeyInit, Mac};
use hyper::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::secrets::Secret;

pub const TIMESTAMP_HEADER: &str = "x-hoox-timestamp";
pub const SIGNATURE_HEADER: &str = "x-hoox-signature";
/// How far a signed timestamp may be from our clock, either way.
pub const HMAC_WINDOW_S: u64 = 300;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    ApiKey,
    Hmac,
    Bearer,
    Mtls,
}

impl Method {
    pub const ALL: [Method; 4] = [Method::ApiKey, Method::Hmac, Method::Bearer, Method::Mtls];

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::ApiKey => "api_key",
            Method::Hmac => "hmac",
            Method::Bearer => "bearer",
            Method::Mtls => "mtls",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Method::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| format!("unknown auth method `{s}` (api_key, hmac, bearer, mtls)"))
    }
}

/// Why a request was refused, for the logs. The client always sees one 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no credential")]
    Missing,
    #[error("invalid credential")]
    Invalid,
    #[error("signature timestamp outside the window")]
    Expired,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthConfigError {
    #[error("no authentication method is configured; refusing to accept unauthenticated trades")]
    NoMethod,
    #[error("auth method `{0}` is required but not configured")]
    RequiredNotConfigured(Method),
    /// One secret given to another client in another method's file (`@desk-a S` among the
    /// API keys, `S` among the bearer tokens): a sender that retried by the other method
    /// would be the other client, its key in another namespace, its trade placed again.
    #[error(
        "a secret of auth.{first} is also in auth.{second}, for another client \
         ({first_client} there, {second_client} here): a sender retrying by the other \
         method would be another client, and its trade placed again; give a secret one \
         client in every file"
    )]
    SecretForTwoClients {
        first: &'static str,
        first_client: String,
        second: &'static str,
        second_client: String,
    },
}

/// What the authenticator needs from a request.
pub struct AuthInput<'a> {
    pub headers: &'a HeaderMap,
    pub body_api_key: Option<&'a str>,
    pub raw_body: &'a [u8],
    /// The name of a client certificate that the TLS layer verified against the client
    /// CA (`tls::client_name`).
    pub client_cert_name: Option<&'a str>,
    pub now_unix_s: i64,
}

/// A request that authenticated: who sent it, and its HMAC signature if one verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    pub identity: Identity,
    pub signature: Option<Signature>,
}

/// A verified HMAC signature. Unlike a static secret it names one request, and it keeps
/// authenticating that request, and only that one, until its timestamp leaves the window:
/// the gateway holds a key of its own until then (`mutex::Guard`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub timestamp: i64,
    pub mac: [u8; 32],
}

impl Signature {
    /// The unix second after which it no longer authenticates.
    pub fn valid_until(&self) -> i64 {
        self.timestamp.saturating_add(HMAC_WINDOW_S as i64)
    }
}

/// Who sent a request, as it namespaces client keys: `cert.<name>` (or
/// `certhash.<prefix>.<hash>`, see [`Identity::cert`]) for a client certificate, `psk` for
/// a shared secret. At most 64 characters of `[A-Za-z0-9._-]`,
/// so it never contains the `:` that separates the parts of a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity(String);

impl Identity {
    pub fn psk() -> Self {
        Identity("psk".into())
    }

    /// A shared secret that names its client: `psk.<name>` (the name is checked when the
    /// secrets file is read: at most 60 of `[A-Za-z0-9._-]`).
    pub fn psk_of(client: Option<&str>) -> Self {
        match client {
            Some(name) => Identity(format!("psk.{name}")),
            None => Identity::psk(),
        }
    }

    /// A certificate's name, as `cert.<name>` when it fits the charset and the length.
    /// Any other name becomes `certhash.<prefix>.<hash>`: the name cleaned (`_` for what
    /// the charset lacks), cut, and the first 16 hex digits of its SHA-256. Cleaning alone
    /// would give `desk a` and `desk_a`, or two long names that differ only at their
    /// ends, one namespace: one client's key would then answer the other's trade. No
    /// clean name starts with `certhash.`, so the two forms never meet.
    pub fn cert(name: &str) -> Self {
        const CLEAN: &str = "cert.";
        const HASHED: &str = "certhash.";
        const DIGITS: usize = 16;
        let fits = identity_char;
        let max = crate::mutex::key::MAX_IDENTITY;
        if !name.is_empty() && name.len() <= max - CLEAN.len() && name.chars().all(fits) {
            return Identity(format!("{CLEAN}{name}"));
        }
        let digest = sha2::Sha256::digest(name.as_bytes());
        let mut s = String::from(HASHED);
        s.extend(
            name.chars()
                .take(max - HASHED.len() - 1 - DIGITS)
                .map(|c| if fits(c) { c } else { '_' }),
        );
        s.push('.');
        s.push_str(&hex::encode(&digest[..DIGITS / 2]));
        Identity(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What an identity's names are made of, a client's on a secrets line and a certificate's
/// alike: `[A-Za-z0-9._-]`, never the `:` that separates the parts of a key.
pub(crate) fn identity_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug)]
pub struct Authenticator {
    api_keys: Vec<Secret>,
    hmac: Vec<Secret>,
    bearer: Vec<Secret>,
    mtls: bool,
    required: Vec<Method>,
}

impl Authenticator {
    /// `required` empty: any one configured method that verifies is enough. Otherwise
    /// each listed method must verify. A configuration that could let anything through
    /// unauthenticated, or that requires a method it cannot check, is refused.
    pub fn new(
        api_keys: Vec<Secret>,
        hmac: Vec<Secret>,
        bearer: Vec<Secret>,
        mtls: bool,
        required: Vec<Method>,
    ) -> Result<Self, AuthConfigError> {
        let a = Authenticator {
            api_keys,
            hmac,
            bearer,
            mtls,
            required,
        };
        if !Method::ALL.iter().any(|&m| a.configured(m)) {
            return Err(AuthConfigError::NoMethod);
        }
        if let Some(&m) = a.required.iter().find(|&&m| !a.configured(m)) {
            return Err(AuthConfigError::RequiredNotConfigured(m));
        }
        // With client certificates every sender is its certificate's client, whatever
        // secret it also holds: a secret's client names no namespace, so none can clash.
        // (Each file refuses a secret on two of its own lines for two clients.)
        if !a.mtls {
            let files = [
                ("api_keys_file", &a.api_keys),
                ("hmac_secrets_file", &a.hmac),
                ("bearer_tokens_file", &a.bearer),
            ];
            for (i, &(first, earlier)) in files.iter().enumerate() {
                for &(second, later) in &files[i + 1..] {
                    // Not timed: the files' own contents, compared once at a load.
                    let clash = later.iter().find_map(|l| {
                        let e = earlier
                            .iter()
                            .find(|e| e.expose() == l.expose() && e.client() != l.client())?;
                        Some((e.client(), l.client()))
                    });
                    if let Some((e, l)) = clash {
                        let name = |c| Identity::psk_of(c).as_str().to_owned();
                        return Err(AuthConfigError::SecretForTwoClients {
                            first,
                            first_client: name(e),
                            second,
                            second_client: name(l),
                        });
                    }
                }
            }
        }
        Ok(a)
    }

    /// The namespaces a sender can be in, for a reload to say which it takes away: with
    /// client certificates (`mtls`), every sender is its certificate's client (`cert.*`),
    /// whatever secret it also holds, since a handshake without one is refused; else the
    /// ones the shared secrets give (`psk`, `psk.NAME`).
    pub fn namespaces(&self) -> std::collections::BTreeSet<String> {
        if self.mtls {
            return ["cert.*".to_owned()].into();
        }
        [&self.api_keys, &self.hmac, &self.bearer]
            .into_iter()
            .flatten()
            .map(|s| Identity::psk_of(s.client()).as_str().to_owned())
            .collect()
    }

    /// Whether a sender can be in `identity` (a namespace of [`Authenticator::namespaces`];
    /// with client certificates, any certificate's).
    pub fn gives(&self, identity: &str) -> bool {
        if self.mtls {
            return identity.starts_with("cert.") || identity.starts_with("certhash.");
        }
        self.namespaces().contains(identity)
    }

    /// The secrets `after` keeps but names another client (`psk` → `psk.desk-b`): the
    /// old namespace and the new, once each. Under mTLS the certificate names the client,
    /// not the secret: none. A reload says them: a sender's retries move to the new
    /// namespace, where the keys its trades took before are not.
    pub fn renamed(&self, after: &Authenticator) -> Vec<(String, String)> {
        if self.mtls || after.mtls {
            return Vec::new();
        }
        let pairs = [
            (&self.api_keys, &after.api_keys),
            (&self.hmac, &after.hmac),
            (&self.bearer, &after.bearer),
        ];
        let mut moved: Vec<(String, String)> = pairs
            .into_iter()
            .flat_map(|(old, new)| {
                old.iter()
                    .flat_map(move |o| new.iter().map(move |n| (o, n)))
            })
            .filter(|(o, n)| o.expose() == n.expose() && o.client() != n.client())
            .map(|(o, n)| {
                let name = |s: &Secret| Identity::psk_of(s.client()).as_str().to_owned();
                (name(o), name(n))
            })
            .collect();
        moved.sort();
        moved.dedup();
        moved
    }

    pub fn configured(&self, m: Method) -> bool {
        match m {
            Method::ApiKey => !self.api_keys.is_empty(),
            Method::Hmac => !self.hmac.is_empty(),
            Method::Bearer => !self.bearer.is_empty(),
            Method::Mtls => self.mtls,
        }
    }

    pub fn authenticate(&self, req: &AuthInput<'_>) -> Result<Authenticated, AuthError> {
        // Every configured method is checked (or every required one), so a refusal
        // reports the most telling reason: a wrong credential beats an expired one beats
        // none at all; and a signature that verified is known even when another method
        // was enough.
        let checked: Vec<_> = if self.required.is_empty() {
            Method::ALL
                .into_iter()
                .filter(|&m| self.configured(m))
                .map(|m| self.check(m, req))
                .collect()
        } else {
            self.required.iter().map(|&m| self.check(m, req)).collect()
        };
        let passed = if self.required.is_empty() {
            checked.iter().any(Result::is_ok)
        } else {
            checked.iter().all(Result::is_ok)
        };
        if !passed {
            return Err(worst(checked.into_iter().filter_map(Result::err)));
        }
        // The clients the verified shared secrets name: one, or none (the shared `psk`).
        // Credentials of two clients on one request are refused: its keys would belong to
        // whichever was looked at first.
        let verified: Vec<Verified> = checked.into_iter().filter_map(Result::ok).collect();
        let mut clients = verified.iter().filter(|v| v.shared).map(|v| v.client);
        let client = clients.next().flatten();
        if clients.any(|c| c != client) {
            return Err(AuthError::Invalid);
        }
        Ok(Authenticated {
            identity: match req.client_cert_name {
                Some(cn) => Identity::cert(cn),
                None => Identity::psk_of(client),
            },
            signature: verified.into_iter().find_map(|v| v.signature),
        })
    }

    fn check<'a>(&'a self, m: Method, req: &AuthInput<'_>) -> Result<Verified<'a>, AuthError> {
        match m {
            Method::ApiKey => {
                let presented = req.body_api_key.ok_or(AuthError::Missing)?;
                matches_any(&self.api_keys, presented.as_bytes()).map(Verified::shared)
            }
            Method::Bearer => {
                let v = single(req.headers, hyper::header::AUTHORIZATION.as_str())?;
                let (scheme, token) = v.split_once(' ').ok_or(AuthError::Invalid)?;
                let token = token.trim_start_matches(' ');
                if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
                    return Err(AuthError::Invalid);
                }
                matches_any(&self.bearer, token.as_bytes()).map(Verified::shared)
            }
            Method::Hmac => self.check_hmac(req),
            Method::Mtls => match req.client_cert_name {
                Some(_) if self.mtls => Ok(Verified {
                    shared: false,
                    client: None,
                    signature: None,
                }),
                _ => Err(AuthError::Missing),
            },
        }
    }

    fn check_hmac<'a>(&'a self, req: &AuthInput<'_>) -> Result<Verified<'a>, AuthError> {
        let ts_text = single(req.headers, TIMESTAMP_HEADER);
        let sig_text = single(req.headers, SIGNATURE_HEADER);
        if let (Err(AuthError::Missing), Err(AuthError::Missing)) = (&ts_text, &sig_text) {
            return Err(AuthError::Missing);
        }
        let ts_text = ts_text.map_err(|_| AuthError::Invalid)?;
        let sig = parse_signature_header(sig_text.map_err(|_| AuthError::Invalid)?)?;
        let ts = parse_timestamp(ts_text)?;
        if ts.abs_diff(req.now_unix_s) > HMAC_WINDOW_S {
            return Err(AuthError::Expired);
        }
        // The signed text uses the timestamp exactly as sent.
        let mut found = None;
        for s in &self.hmac {
            let ok = mac(s.expose(), ts_text.as_bytes(), req.raw_body).ct_eq(&sig);
            // Every secret is tried, each in constant time. Which one matched is noted with
            // a branch: it names only the client, which its sender knows already.
            if bool::from(ok) {
                found = Some(s);
            }
        }
        let s = found.ok_or(AuthError::Invalid)?;
        Ok(Verified {
            signature: Some(Signature {
                timestamp: ts,
                mac: sig,
            }),
            ..Verified::shared(s)
        })
    }
}

/// What one method verified.
struct Verified<'a> {
    /// A shared secret (not a client certificate).
    shared: bool,
    /// The client that secret names, if any.
    client: Option<&'a str>,
    signature: Option<Signature>,
}

impl<'a> Verified<'a> {
    fn shared(s: &'a Secret) -> Self {
        Verified {
            shared: true,
            client: s.client(),
            signature: None,
        }
    }
}

fn worst(errors: impl Iterator<Item = AuthError>) -> AuthError {
    let rank = |e: &AuthError| match e {
        AuthError::Missing => 0,
        AuthError::Expired => 1,
        AuthError::Invalid => 2,
    };
    errors.max_by_key(rank).unwrap_or(AuthError::Missing)
}

/// The one value of a header; a repeated credential header is refused rather than
/// letting us and a proxy disagree on which one counts.
fn single<'h>(headers: &'h HeaderMap, name: &str) -> Result<&'h str, AuthError> {
    let mut all = headers.get_all(name).iter();
    match (all.next(), all.next()) {
        (None, _) => Err(AuthError::Missing),
        (Some(v), None) => v.to_str().map(str::trim).map_err(|_| AuthError::Invalid),
        (Some(_), Some(_)) => Err(AuthError::Invalid),
    }
}

/// The secret `presented` is, compared with every one in constant time, through SHA-256
/// so that lengths do not leak either. All are tried, so how many there are before the
/// match does not show in timing; which one matched is noted with a branch, which names
/// only the client, and its sender knows that.
fn matches_any<'a>(secrets: &'a [Secret], presented: &[u8]) -> Result<&'a Secret, AuthError> {
    let p = Sha256::digest(presented);
    let mut found = None;
    for s in secrets {
        if bool::from(Sha256::digest(s.expose()).as_slice().ct_eq(p.as_slice())) {
            found = Some(s);
        }
    }
    found.ok_or(AuthError::Invalid)
}

fn parse_timestamp(s: &str) -> Result<i64, AuthError> {
    // Digits only: no sign, no spaces, no `+`, which `i64::from_str` would accept.
    if s.is_empty() || s.len() > 18 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AuthError::Invalid);
    }
    s.parse().map_err(|_| AuthError::Invalid)
}

fn mac(secret: &[u8], timestamp: &[u8], body: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length, so this cannot fail.
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    m.update(timestamp);
    m.update(b".");
    m.update(body);
    m.finalize().into_bytes().into()
}

/// The `X-Hoox-Signature` value for a body: `sha256=<hex>` over `"{timestamp}.{body}"`.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    format!(
        "sha256={}",
        hex::encode(mac(secret, timestamp.to_string().as_bytes(), body))
    )
}

/// Parses `sha256=<64 hex digits>`.
pub fn parse_signature_header(v: &str) -> Result<[u8; 32], AuthError> {
    let hex_part = v.trim().strip_prefix("sha256=").ok_or(AuthError::Invalid)?;
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_part, &mut out).map_err(|_| AuthError::Invalid)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::MAX_CLIENT_NAME;
    use hyper::header::{AUTHORIZATION, HeaderValue};

    const NOW: i64 = 1_800_000_000;
    const BODY: &[u8] = br#"{"exchange":"binance","quantity":1}"#;

    /// Secrets as a secrets file's lines give them: `@NAME SECRET` names its client.
    fn secrets(s: &[&str]) -> Vec<Secret> {
        s.iter()
            .map(|l| Secret::parse_line(l.as_bytes()).unwrap())
            .collect()
    }

    fn auth(
        api: &[&str],
        hmac: &[&str],
        bearer: &[&str],
        mtls: bool,
        req: &[Method],
    ) -> Authenticator {
        Authenticator::new(
            secrets(api),
            secrets(hmac),
            secrets(bearer),
            mtls,
            req.to_vec(),
        )
        .unwrap()
    }

    struct Req {
        headers: HeaderMap,
        api_key: Option<&'static str>,
        cn: Option<&'static str>,
        body: &'static [u8],
        now: i64,
    }

    impl Req {
        fn new() -> Self {
            Req {
                headers: HeaderMap::new(),
                api_key: None,
                cn: None,
                body: BODY,
                now: NOW,
            }
        }
        fn header(mut self, k: &'static str, v: &str) -> Self {
            self.headers.append(k, HeaderValue::from_str(v).unwrap());
            self
        }
        fn signed(self, secret: &str, ts: i64) -> Self {
            let sig = sign(secret.as_bytes(), ts, self.body);
            self.header(TIMESTAMP_HEADER, &ts.to_string())
                .header(SIGNATURE_HEADER, &sig)
        }
        fn run(&self, a: &Authenticator) -> Result<Identity, AuthError> {
            self.authenticated(a).map(|ok| ok.identity)
        }
        fn authenticated(&self, a: &Authenticator) -> Result<Authenticated, AuthError> {
            a.authenticate(&AuthInput {
                headers: &self.headers,
                body_api_key: self.api_key,
                raw_body: self.body,
                client_cert_name: self.cn,
                now_unix_s: self.now,
            })
        }
    }

    #[test]
    fn secrets_never_show() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "Secret(***)");
        let a = auth(&["hunter2"], &[], &[], false, &[]);
        assert!(!format!("{a:?}").contains("hunter2"));
    }

    #[test]
    fn fail_closed_configs_are_refused() {
        assert_eq!(
            Authenticator::new(vec![], vec![], vec![], false, vec![]).unwrap_err(),
            AuthConfigError::NoMethod
        );
        assert_eq!(
            Authenticator::new(secrets(&["k"]), vec![], vec![], false, vec![Method::Hmac])
                .unwrap_err(),
            AuthConfigError::RequiredNotConfigured(Method::Hmac)
        );
        // The operator reads the method by its config name.
        assert_eq!(
            AuthConfigError::RequiredNotConfigured(Method::Hmac).to_string(),
            "auth method `hmac` is required but not configured"
        );
        assert!(Authenticator::new(vec![], vec![], vec![], true, vec![]).is_ok());
    }

    /// A secret given one client in one method's file and another in another's is
    /// refused: a sender retrying by the other method would be another client, and its
    /// trade placed again. The same client in both, or client certificates (whose name is
    /// the client), is taken; the message names both files and clients, never the secret.
    #[test]
    fn a_secret_given_two_clients_in_two_files_is_refused() {
        let new = |api: &[&str], hmac: &[&str], bearer: &[&str], mtls| {
            Authenticator::new(secrets(api), secrets(hmac), secrets(bearer), mtls, vec![])
        };
        let refused = new(&["k"], &[], &["@desk-a k"], false).unwrap_err();
        assert_eq!(
            refused,
            AuthConfigError::SecretForTwoClients {
                first: "api_keys_file",
                first_client: "psk".into(),
                second: "bearer_tokens_file",
                second_client: "psk.desk-a".into(),
            }
        );
        let said = refused.to_string();
        assert!(
            said.starts_with(
                "a secret of auth.api_keys_file is also in auth.bearer_tokens_file, for \
                 another client (psk there, psk.desk-a here)"
            ),
            "{said}"
        );
        assert!(!said.contains(" k "), "{said}");
        // Two names, the HMAC file against the bearer file, the clash past other lines.
        assert!(matches!(
            new(&[], &["@a x", "@b k"], &["y", "@c k"], false),
            Err(AuthConfigError::SecretForTwoClients {
                first: "hmac_secrets_file",
                second: "bearer_tokens_file",
                ..
            })
        ));
        for fine in [
            new(&["k"], &["k"], &["k"], false),
            new(&["@desk-a k"], &["@desk-a k"], &[], false),
            new(&["@desk-a k"], &[], &["@desk-b j"], false),
            new(&["k"], &[], &["@desk-a k"], true),
        ] {
            assert!(fine.is_ok(), "{fine:?}");
        }
    }

    #[test]
    fn api_key_in_the_body_with_rotation() {
        let a = auth(&["old-key", "new-key"], &[], &[], false, &[]);
        let mut r = Req::new();
        assert_eq!(r.run(&a), Err(AuthError::Missing));
        r.api_key = Some("new-key");
        assert_eq!(r.run(&a), Ok(Identity::psk()));
        r.api_key = Some("old-key");
        assert!(r.run(&a).is_ok());
        for bad in ["new-ke", "new-key ", "", "NEW-KEY", "new-keyx"] {
            r.api_key = Some(bad);
            assert_eq!(r.run(&a), Err(AuthError::Invalid), "{bad}");
        }
    }

    #[test]
    fn hmac_signature_and_window() {
        let a = auth(&[], &["s1", "s2"], &[], false, &[]);
        assert_eq!(Req::new().run(&a), Err(AuthError::Missing));
        assert!(Req::new().signed("s1", NOW).run(&a).is_ok());
        assert!(Req::new().signed("s2", NOW).run(&a).is_ok());
        assert!(Req::new().signed("s1", NOW - 300).run(&a).is_ok());
        assert!(Req::new().signed("s1", NOW + 300).run(&a).is_ok());
        assert_eq!(
            Req::new().signed("s1", NOW - 301).run(&a),
            Err(AuthError::Expired)
        );
        assert_eq!(
            Req::new().signed("s1", NOW + 301).run(&a),
            Err(AuthError::Expired)
        );
        assert_eq!(
            Req::new().signed("s3", NOW).run(&a),
            Err(AuthError::Invalid)
        );
        // The signature covers the body.
        let mut r = Req::new().signed("s1", NOW);
        r.body = br#"{"exchange":"binance","quantity":100}"#;
        assert_eq!(r.run(&a), Err(AuthError::Invalid));
        // And the timestamp: a fresh timestamp on an old signature fails.
        let old = sign(b"s1", NOW - 1000, BODY);
        let r = Req::new()
            .header(TIMESTAMP_HEADER, &NOW.to_string())
            .header(SIGNATURE_HEADER, &old);
        assert_eq!(r.run(&a), Err(AuthError::Invalid));
    }

    /// A secret kept by a reload under another name is said once, old name and new; one
    /// that keeps its name, one taken out and one added are not.
    #[test]
    fn a_secret_kept_under_another_name_is_renamed() {
        let before = auth(
            &["key-a", "@desk-b key-b"],
            &["@desk-c hmac-c", "hmac-gone"],
            &[],
            false,
            &[],
        );
        let after = auth(
            &["@desk-a key-a", "@desk-b key-b"],
            &["@desk-c2 hmac-c", "@desk-d hmac-new"],
            &[],
            false,
            &[],
        );
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            before.renamed(&after),
            [pair("psk", "psk.desk-a"), pair("psk.desk-c", "psk.desk-c2")]
        );
        assert_eq!(after.renamed(&after), []);
    }

    /// A verified signature is reported, whichever method was enough; an unverified one,
    /// or one a `require` list does not check, is not.
    #[test]
    fn a_verified_signature_is_reported() {
        let genuine = Some(Signature {
            timestamp: NOW,
            mac: parse_signature_header(&sign(b"s1", NOW, BODY)).unwrap(),
        });
        let signature = |a: &Authenticator, r: Req| r.authenticated(a).map(|ok| ok.signature);
        let any = auth(&[], &["s1"], &["tok"], false, &[]);
        let bearer = || Req::new().header("authorization", "Bearer tok");
        assert_eq!(
            signature(&any, Req::new().signed("s1", NOW)),
            Ok(genuine.clone())
        );
        assert_eq!(
            signature(&any, bearer().signed("s1", NOW)),
            Ok(genuine.clone())
        );
        assert_eq!(signature(&any, bearer()), Ok(None));
        assert_eq!(signature(&any, bearer().signed("s9", NOW)), Ok(None));
        let only_bearer = auth(&[], &["s1"], &["tok"], false, &[Method::Bearer]);
        assert_eq!(
            signature(&only_bearer, bearer().signed("s1", NOW)),
            Ok(None)
        );
        let both = auth(
            &[],
            &["s1"],
            &["tok"],
            false,
            &[Method::Bearer, Method::Hmac],
        );
        assert_eq!(signature(&both, bearer().signed("s1", NOW)), Ok(genuine));
    }

    #[test]
    fn hmac_headers_are_strict() {
        let a = auth(&[], &["s1"], &[], false, &[]);
        let sig = sign(b"s1", NOW, BODY);
        let only_sig = Req::new().header(SIGNATURE_HEADER, &sig);
        assert_eq!(only_sig.run(&a), Err(AuthError::Invalid));
        let only_ts = Req::new().header(TIMESTAMP_HEADER, &NOW.to_string());
        assert_eq!(only_ts.run(&a), Err(AuthError::Invalid));
        for ts in [
            "+1800000000",
            "-1",
            "1800000000.0",
            "",
            "0x10",
            "1000000000000000000", // 19 digits: fits an i64, but no timestamp is that long
            "99999999999999999999",
        ] {
            let r = Req::new()
                .header(TIMESTAMP_HEADER, ts)
                .header(SIGNATURE_HEADER, &sig);
            assert_eq!(r.run(&a), Err(AuthError::Invalid), "{ts}");
        }
        let twice = Req::new().signed("s1", NOW).header(SIGNATURE_HEADER, &sig);
        assert_eq!(twice.run(&a), Err(AuthError::Invalid));
        // Extreme timestamps do not overflow the window check.
        let far = Req::new().signed("s1", 999_999_999_999_999_999);
        assert_eq!(far.run(&a), Err(AuthError::Expired));
        let mut neg_now = Req::new().signed("s1", 0);
        neg_now.now = i64::MIN;
        assert_eq!(neg_now.run(&a), Err(AuthError::Expired));
    }

    #[test]
    fn sign_and_parse_round_trip() {
        let s = sign(b"key", 1_700_000_000, b"{}");
        assert!(s.starts_with("sha256=") && s.len() == 7 + 64);
        let raw = parse_signature_header(&s).unwrap();
        assert_eq!(hex::encode(raw), &s[7..]);
        assert_eq!(
            parse_signature_header(&s.to_uppercase().replace("SHA256=", "sha256=")),
            Ok(raw)
        );
        for bad in [
            "",
            "sha256=",
            "sha1=00",
            "sha256=zz",
            &s[..s.len() - 1],
            &format!("{s}00"),
        ] {
            assert_eq!(
                parse_signature_header(bad),
                Err(AuthError::Invalid),
                "{bad}"
            );
        }
    }

    #[test]
    fn sign_matches_a_known_vector() {
        // HMAC-SHA256(key="key", "1700000000.{}"), computed independently with
        // `printf '1700000000.{}' | openssl dgst -sha256 -hmac key`.
        assert_eq!(
            sign(b"key", 1_700_000_000, b"{}"),
            format!("sha256={}", KNOWN_VECTOR)
        );
    }

    const KNOWN_VECTOR: &str = "9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae";

    #[test]
    fn bearer_token() {
        let a = auth(&[], &[], &["tok1", "tok2"], false, &[]);
        assert_eq!(Req::new().run(&a), Err(AuthError::Missing));
        assert!(
            Req::new()
                .header("authorization", "Bearer tok1")
                .run(&a)
                .is_ok()
        );
        assert!(
            Req::new()
                .header("authorization", "bearer   tok2")
                .run(&a)
                .is_ok()
        );
        for bad in [
            "Bearer tok3",
            "Basic tok1",
            "Bearer",
            "Bearer ",
            "tok1",
            "Bearer tok1x",
        ] {
            let r = Req::new().header("authorization", bad);
            assert_eq!(r.run(&a), Err(AuthError::Invalid), "{bad}");
        }
        let twice = Req::new()
            .header("authorization", "Bearer tok1")
            .header("authorization", "Bearer tok1");
        assert_eq!(twice.run(&a), Err(AuthError::Invalid));
        let _ = AUTHORIZATION;
    }

    #[test]
    fn mtls_identity_is_sanitised_and_bounded() {
        let a = auth(&[], &[], &[], true, &[]);
        assert_eq!(Req::new().run(&a), Err(AuthError::Missing));
        let mut r = Req::new();
        r.cn = Some("signal-engine.lan");
        assert_eq!(r.run(&a).unwrap().as_str(), "cert.signal-engine.lan");
        r.cn = Some("evil:live:x y/é");
        let id = r.run(&a).unwrap();
        assert!(id.as_str().starts_with("certhash.evil_live_x_y__."), "{id}");
        let max = crate::mutex::key::MAX_IDENTITY;
        let long = Identity::cert(&"c".repeat(500));
        assert_eq!(long.as_str().len(), max);
        // The identity keeps client keys well formed: no ':' that could shift the namespace.
        let k = crate::mutex::ClientKey::parse("a:b").unwrap();
        let key = crate::mutex::Key::client(id.as_str(), crate::mutex::Mode::Live, &k).unwrap();
        assert_eq!(key.as_str(), format!("client:{id}:live:a:b"));
        // Distinct names, distinct namespaces: what cleaning or cutting would have merged.
        let names = [
            "desk a".to_string(),
            "desk_a".to_string(),
            "desk/a".to_string(),
            "d".repeat(max - 5),
            "d".repeat(max - 4),
            format!("{}x", "d".repeat(200)),
            format!("{}y", "d".repeat(200)),
            "certhash.desk_a".to_string(),
            String::new(),
        ];
        let ids: Vec<Identity> = names.iter().map(|n| Identity::cert(n)).collect();
        for (i, a) in ids.iter().enumerate() {
            assert!(a.as_str().len() <= max, "{a}");
            assert!(crate::mutex::Key::client(a.as_str(), crate::mutex::Mode::Live, &k).is_ok());
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // A clean name that fits keeps the plain form, as before.
        assert_eq!(ids[1].as_str(), "cert.desk_a");
        assert_eq!(ids[3].as_str(), format!("cert.{}", "d".repeat(max - 5)));
    }

    #[test]
    fn any_one_method_when_none_is_required() {
        let a = auth(&["k"], &["s"], &["t"], false, &[]);
        let mut r = Req::new().header("authorization", "Bearer t");
        assert!(r.run(&a).is_ok());
        // A wrong credential beside a right one: the right one authenticates.
        r.api_key = Some("wrong");
        assert!(r.run(&a).is_ok());
        // Failures report the most telling reason.
        let mut r = Req::new().signed("s", NOW - 1000);
        assert_eq!(r.run(&a), Err(AuthError::Expired));
        r.api_key = Some("wrong");
        assert_eq!(r.run(&a), Err(AuthError::Invalid));
        // A client certificate counts only where mTLS is configured.
        let mut r = Req::new();
        r.cn = Some("engine");
        assert_eq!(r.run(&a), Err(AuthError::Missing));
    }

    #[test]
    fn required_methods_must_all_verify() {
        let a = auth(&["k"], &["s"], &[], true, &[Method::Hmac, Method::Mtls]);
        let mut r = Req::new().signed("s", NOW);
        assert_eq!(r.run(&a), Err(AuthError::Missing));
        r.cn = Some("engine");
        assert_eq!(r.run(&a).unwrap().as_str(), "cert.engine");
        // The api key is configured but not required, so it alone is not enough.
        let mut r = Req::new();
        r.api_key = Some("k");
        r.cn = Some("engine");
        assert_eq!(r.run(&a), Err(AuthError::Missing));
    }

    /// A secret that names its client puts that client's keys in a namespace of its own,
    /// whichever method carried it; two clients' credentials on one request are refused.
    #[test]
    fn a_secret_that_names_its_client_gives_it_its_own_namespace() {
        let a = auth(
            &["@desk-a key-a", "key-shared"],
            &["@desk-a hmac-a", "@desk-b hmac-b"],
            &["@desk-b\ttok-b", "@desk-a tok-a"],
            false,
            &[],
        );
        let id = |r: &Req| r.run(&a).map(|i| i.as_str().to_owned());
        let mut r = Req::new();
        r.api_key = Some("key-a");
        assert_eq!(id(&r).as_deref(), Ok("psk.desk-a"));
        r.api_key = Some("key-shared");
        assert_eq!(id(&r).as_deref(), Ok("psk"));
        // The name is not part of the secret.
        r.api_key = Some("@desk-a key-a");
        assert_eq!(id(&r), Err(AuthError::Invalid));
        let r = Req::new().signed("hmac-b", NOW);
        assert_eq!(id(&r).as_deref(), Ok("psk.desk-b"));
        // A signature is reported (its guard keyed by it alone) whatever certificate the
        // request came with.
        let mut r = Req::new().signed("hmac-b", NOW);
        r.cn = Some("engine");
        let ok = r.authenticated(&a).unwrap();
        assert_eq!(ok.identity.as_str(), "cert.engine");
        assert!(ok.signature.is_some());
        let r = Req::new().header("authorization", "Bearer tok-b");
        assert_eq!(id(&r).as_deref(), Ok("psk.desk-b"));
        // One client on two methods is that client; two clients are refused.
        let mut r = Req::new().header("authorization", "Bearer tok-a");
        r.api_key = Some("key-a");
        assert_eq!(id(&r).as_deref(), Ok("psk.desk-a"));
        let mut r = Req::new().signed("hmac-b", NOW);
        r.api_key = Some("key-a");
        assert_eq!(id(&r), Err(AuthError::Invalid));
        let mut r = Req::new().header("authorization", "Bearer tok-a");
        r.api_key = Some("key-shared");
        assert_eq!(id(&r), Err(AuthError::Invalid));

        let line = |l: &str| Secret::parse_line(l.as_bytes());
        for bad in ["@", "@desk-a", "@desk-a   ", "@desk:a s", "@ s", "@dé s"] {
            assert!(line(bad).is_err(), "{bad:?}");
        }
        // The secret is all that follows the name, spaces within it too.
        let s = line("@desk a secret").unwrap();
        assert_eq!((s.client(), s.expose()), (Some("desk"), &b"a secret"[..]));
        assert!(line(&format!("@{} s", "n".repeat(MAX_CLIENT_NAME))).is_ok());
        assert!(line(&format!("@{} s", "n".repeat(MAX_CLIENT_NAME + 1))).is_err());
        let max = Identity::psk_of(Some(&"n".repeat(MAX_CLIENT_NAME)));
        assert!(max.as_str().len() <= crate::mutex::key::MAX_IDENTITY);
    }

    #[test]
    fn method_names() {
        for m in Method::ALL {
            assert_eq!(m.as_str().parse::<Method>(), Ok(m));
        }
        assert!("basic".parse::<Method>().is_err());
    }
}
