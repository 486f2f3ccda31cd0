//! TOML → a typed [`Config`]. Every error names the key and the file (SPEC §7), and the
//! binary exits 78 (EX_CONFIG) on any of them, from `check-config` and at start alike.
//!
//! Parse, don't validate: once a `Config` exists, its paths are absolute, its durations are
//! in range, its secrets are loaded and its certificate parses. Nothing downstream checks
//! again.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::admin::Listen;
use crate::gateway::auth::{AuthConfigError, Authenticator, Method};
use crate::gateway::tls::{TlsError, TlsFiles};
use crate::secrets::{self, Secret};

/// The most `server.max_connections` may be.
const MAX_CONNECTIONS: usize = 1_000_000;

/// The exit code for every configuration error (sysexits.h EX_CONFIG).
pub const EX_CONFIG: i32 = 78;

/// A configuration error: which file, which key, what is wrong. Never holds a secret.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {key}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub key: String,
    pub message: String,
}

impl ConfigError {
    fn new(file: &Path, key: &str, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.display().to_string(),
            key: key.to_string(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DuplicateResponse {
    /// 409 DUPLICATE, as in the seed.
    Reject,
    /// A duplicate of a committed key gets the stored answer, `Idempotent-Replayed: true`.
    Replay,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnknown {
    /// A timed-out order may have filled: keep the key until its TTL (default).
    Hold,
    /// The seed's behaviour: release on any error.
    Release,
}

#[derive(Debug, Clone)]
pub enum ExecutorKind {
    Paper,
    /// Checked by building an executor from it once, as `serve` will.
    Http(crate::executor::HttpConfig),
}

impl ExecutorKind {
    /// `paper` or `http`, as `/status` says it: a monitor can tell a gateway that places
    /// no orders (a packaged config put back by an upgrade) from one that does.
    pub fn kind(&self) -> &'static str {
        match self {
            ExecutorKind::Paper => "paper",
            ExecutorKind::Http(_) => "http",
        }
    }

    /// The executor in a phrase, for the log at start: an operator reading the journal must
    /// be able to tell that fills are simulated. Of an HTTP executor, only where orders go.
    pub fn describe(&self) -> String {
        match self {
            ExecutorKind::Paper => "paper: fills are simulated, no order leaves this host".into(),
            ExecutorKind::Http(h) => format!("http: orders go to {}", h.origin()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The file this came from, for messages; `None` for the embedded defaults.
    pub source: Option<PathBuf>,
    pub listen: SocketAddr,
    pub tls: TlsFiles,
    pub duplicate_response: DuplicateResponse,
    pub max_connections: usize,
    /// Most connections one address may hold (`server.max_connections_per_ip`; by default a
    /// quarter of `max_connections`, at least 16).
    pub max_connections_per_ip: usize,
    pub handshake_timeout: Duration,
    pub header_timeout: Duration,
    pub admin: Option<Listen>,
    pub store_path: PathBuf,
    pub ttl: Duration,
    /// How long a webhook waits for the mutex's answer (its reserve made durable) before
    /// it is refused 503 (`store.timeout`).
    pub store_timeout: Duration,
    pub capacity: usize,
    pub auth: AuthConfig,
    pub executor: ExecutorKind,
    pub on_unknown_outcome: OnUnknown,
    pub rate_per_s: Option<f64>,
    pub burst: u32,
    pub allow_ips: crate::gateway::limits::Allowlist,
    pub require_client_key: bool,
    /// The file's settings that only a restart applies (all but the certificate, its key,
    /// the client CA and `[auth]`), as read: what a reload compares (`Config::reload`).
    /// Empty for the embedded defaults.
    restart_only: RestartOnly,
    /// The keys a command-line flag set in place of the file (`set_listen`, `set_admin`),
    /// with the flag: an error about one names the flag, not a key the file may not hold.
    flagged: Vec<(&'static str, &'static str)>,
}

/// Where the secrets live, and the secrets themselves (loaded, so that a bad file is a
/// start-up error, and re-read on SIGHUP).
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// The config file that names the secrets files: where an error about one points.
    pub config_file: PathBuf,
    pub api_keys_file: Option<PathBuf>,
    pub hmac_secrets_file: Option<PathBuf>,
    pub bearer_tokens_file: Option<PathBuf>,
    pub require: Vec<Method>,
    pub mtls: bool,
    pub api_keys: Vec<Secret>,
    pub hmac_secrets: Vec<Secret>,
    pub bearer_tokens: Vec<Secret>,
}

/// A TOML error as the key it is about (`(syntax)` when it is about none) and its message
/// with the line number: not toml's own rendering, which quotes the offending line, and that
/// may hold a secret (an executor URL with credentials).
pub fn syntax(text: &str, e: &toml::de::Error) -> (String, String) {
    let mut message = e.message().trim().replace('\n', " ");
    // serde names the Rust type a key is read as; a reader wants what to write, and a whole
    // number's range too (the message may be of one out of it).
    let whole = |max: u64| format!("a whole number from 0 to {max}");
    for (rust, said) in [
        ("usize", whole(usize::MAX as u64)),
        ("u64", whole(u64::MAX)),
        ("u32", whole(u32::MAX.into())),
        ("u16", whole(u16::MAX.into())),
        ("f64", "a number".into()),
    ] {
        message = message.replace(&format!("expected {rust}"), &format!("expected {said}"));
    }
    let Some(at) = e
        .span()
        .map(|s| s.start)
        .filter(|at| text.is_char_boundary(*at))
    else {
        return ("(syntax)".into(), message);
    };
    let line = text[..at].matches('\n').count() + 1;
    let Some(key) = key_at(text, at) else {
        // toml names the field it did not know (`unknown field `s3cret`, expected one of
        // ...`): on a line that is not shaped as a key that name is the line's own text,
        // which `key_at` will not say, so neither does the message.
        let message = match message.split_once(", expected") {
            Some((head, tail)) if head.contains('`') => {
                let head = head.split('`').next().unwrap_or_default().trim_end();
                format!("{head}, expected{tail}")
            }
            _ => message,
        };
        return ("(syntax)".into(), format!("line {line}: {message}"));
    };
    (key, format!("line {line}: {message}"))
}

/// The dotted name of the `key = value` line holding byte `at`, when the line and its table
/// header are plain, and shaped as this file's names are (lower case and `_`, dotted):
/// `server.max_connections`. Never any of the value's text, nor a line that only looks
/// like a key: a secrets file given as the config by mistake holds `S3CRETpad==` (or
/// `smallletters==`), whose text before `=` is the secret.
fn key_at(text: &str, at: usize) -> Option<String> {
    let bare = |s: &str| {
        s.split('.').all(|part| {
            !part.is_empty() && part.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        })
    };
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    // Inside a multi-line string the line is a value's text, `=` and all.
    let before = &text[..start];
    let odd = |quotes: &str| before.matches(quotes).count() % 2 == 1;
    if odd("\"\"\"") || odd("'''") {
        return None;
    }
    let line = text[start..].lines().next()?;
    // A bare table name holds no `#`, so whatever follows one is a comment:
    // `[auth]   # at least one` (README's own example) is the table `auth`.
    let table_of = |header: &str| {
        let header = header.split_once('#').map_or(header, |(h, _)| h).trim();
        let table = header.strip_prefix('[')?.strip_suffix(']')?.trim();
        bare(table).then(|| table.to_string())
    };
    // A table header itself: `[sever]`.
    if line.trim().starts_with('[') {
        return table_of(line);
    }
    let (name, value) = line.split_once('=')?;
    // Nothing but `=` right after it is a base64 secret's padding (`onlysmallletters==`),
    // not a key's value: a secret of small letters alone is shaped as a key. A key whose
    // value is missing (`ttl = `) has a space before its `=`, and is named.
    let padding =
        !name.ends_with([' ', '\t']) && value.trim_end().trim_start_matches('=').is_empty();
    let name = name.trim();
    if !bare(name) || padding {
        return None;
    }
    let header = text[..start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['));
    match header {
        None => Some(name.to_string()),
        Some(h) => table_of(h).map(|table| format!("{table}.{name}")),
    }
}

impl AuthConfig {
    /// The request authenticator these credentials make.
    pub fn authenticator(&self) -> Result<Authenticator, AuthConfigError> {
        Authenticator::new(
            self.api_keys.clone(),
            self.hmac_secrets.clone(),
            self.bearer_tokens.clone(),
            self.mtls,
            self.require.clone(),
        )
    }

    /// Reads the secret files again (SIGHUP). An error keeps nothing half-loaded.
    pub fn reload(&self) -> Result<AuthConfig, ConfigError> {
        let mut next = self.clone();
        let load = |path: &Option<PathBuf>, key: &str| match path {
            None => Ok(Vec::new()),
            // The secrets file's own path is in the message.
            Some(p) => secrets::load_secrets(p)
                .map_err(|e| ConfigError::new(&self.config_file, key, e.to_string())),
        };
        next.api_keys = load(&self.api_keys_file, "auth.api_keys_file")?;
        next.hmac_secrets = load(&self.hmac_secrets_file, "auth.hmac_secrets_file")?;
        next.bearer_tokens = load(&self.bearer_tokens_file, "auth.bearer_tokens_file")?;
        Ok(next)
    }
}

// The file as written. `deny_unknown_fields` everywhere: a misspelt key is an error, not a
// silently ignored safety setting.

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    server: RawServer,
    admin: Option<RawAdmin>,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    auth: RawAuth,
    #[serde(default)]
    executor: RawExecutor,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    keys: RawKeys,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
    duplicate_response: Option<String>,
    max_connections: Option<usize>,
    max_connections_per_ip: Option<usize>,
    handshake_timeout: Option<String>,
    header_timeout: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    listen: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawStore {
    path: Option<PathBuf>,
    ttl: Option<String>,
    timeout: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    api_keys_file: Option<PathBuf>,
    hmac_secrets_file: Option<PathBuf>,
    bearer_tokens_file: Option<PathBuf>,
    require: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawExecutor {
    kind: Option<String>,
    url: Option<String>,
    ca_file: Option<PathBuf>,
    timeout: Option<String>,
    on_unknown_outcome: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    rate_per_s: Option<f64>,
    burst: Option<u32>,
    allow_ips: Option<Vec<String>>,
    capacity: Option<usize>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawKeys {
    require_client_key: Option<bool>,
}

/// `path` made absolute, so that the log, `status` and errors name a file where it is, not
/// where a reader standing in another folder would look (`--config config.toml`,
/// `--state-dir state`). Made from the current folder without resolving links; a current
/// folder that cannot be read leaves the path as written, which still names the file this
/// process opens (it never changes folder).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

impl Config {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        // Absolute, as every path it names is (`from_raw`): errors, restart-pending keys
        // and the reload name the file where it is.
        let path = &absolute(path);
        let cannot = |e: &dyn std::fmt::Display| {
            ConfigError::new(path, "(file)", format!("cannot read: {e}"))
        };
        let bytes = crate::secrets::read_regular(path).map_err(|e| cannot(&e))?;
        // Whoever may write it chooses the client CA, the secrets and the executor, which
        // are refused when others may write them: so is the file that names them.
        if let Some(why) = crate::secrets::open_to_writes(path, "settings") {
            return Err(ConfigError::new(path, "(file)", why));
        }
        let text = String::from_utf8(bytes).map_err(|_| cannot(&"not UTF-8 text"))?;
        let raw: RawFile = toml::from_str(&text).map_err(|e| {
            let (key, message) = syntax(&text, &e);
            ConfigError::new(path, &key, message)
        })?;
        // A file's path always has a parent: "" for `config.toml` left relative (a current
        // folder that could not be read), which joins as the current folder does.
        let base = path.parent().unwrap_or(Path::new(""));
        Ok(Config {
            restart_only: RestartOnly::of(&text),
            ..Self::from_raw(raw, path, base)?
        })
    }

    fn from_raw(raw: RawFile, file: &Path, base: &Path) -> Result<Config, ConfigError> {
        let err = |key: &str, msg: String| ConfigError::new(file, key, msg);
        let base = absolute(base);
        let rel = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let need_file = |key: &str, p: &Path| -> Result<(), ConfigError> {
            std::fs::metadata(p)
                .map(|_| ())
                .map_err(|e| err(key, format!("{}: {e}", p.display())))
        };

        let listen = raw.server.listen.as_deref().unwrap_or("0.0.0.0:8443");
        let listen: SocketAddr = listen.parse().map_err(|_| {
            err(
                "server.listen",
                format!(
                    "{listen:?} is not an IP address and a port (1 to 65535) such as \
                         \"0.0.0.0:8443\" or \"[::1]:8443\": a host name is not looked up"
                ),
            )
        })?;
        let cert = rel(raw
            .server
            .cert
            .ok_or_else(|| err("server.cert", "required".into()))?);
        let key = rel(raw
            .server
            .key
            .ok_or_else(|| err("server.key", "required".into()))?);
        need_file("server.cert", &cert)?;
        need_file("server.key", &key)?;
        let client_ca = raw.server.client_ca.map(rel);
        if let Some(ca) = &client_ca {
            need_file("server.client_ca", ca)?;
        }
        let tls = TlsFiles {
            cert,
            key,
            client_ca,
        };
        // Load once now so that a bad certificate is a config error, not a runtime one.
        tls.load().map_err(|e| {
            use crate::gateway::tls::Role;
            let key = match &e {
                TlsError::Key(_)
                | TlsError::File {
                    role: Role::Key, ..
                } => "server.key",
                TlsError::File {
                    role: Role::ClientCa,
                    ..
                } => "server.client_ca",
                _ => "server.cert",
            };
            err(key, e.to_string())
        })?;

        let duplicate_response = match raw.server.duplicate_response.as_deref() {
            None | Some("reject") => DuplicateResponse::Reject,
            Some("replay") => DuplicateResponse::Replay,
            Some(o) => {
                return Err(err(
                    "server.duplicate_response",
                    format!("{o:?}: expected \"reject\" or \"replay\""),
                ));
            }
        };
        let duration = |key: &str, v: &Option<String>, default: Duration| match v {
            None => Ok(default),
            Some(s) => parse_duration(s).map_err(|m| err(key, m)),
        };
        // A timeout of any kind, `MIN_TIMEOUT` to `most`, and why not more if it matters. A
        // zero would drop every connection the moment it was made, and without a word.
        let timeout = |key: &str, v: &Option<String>, default, most, why: &str| {
            let d = duration(key, v, default)?;
            if d < MIN_TIMEOUT || d > most {
                let fmt = humantime::format_duration;
                let range = format!("{} and {}", fmt(MIN_TIMEOUT), fmt(most));
                return Err(err(key, format!("must be between {range}{why}")));
            }
            Ok(d)
        };
        let hour = Duration::from_secs(3600);
        let server_timeout = |key, v| timeout(key, v, Duration::from_secs(10), hour, "");
        let handshake_timeout =
            server_timeout("server.handshake_timeout", &raw.server.handshake_timeout)?;
        let header_timeout = server_timeout("server.header_timeout", &raw.server.header_timeout)?;
        let max_connections = raw.server.max_connections.unwrap_or(1024);
        // The top bound keeps the connection semaphore's own limit (it panics beyond
        // `usize::MAX >> 3`) out of reach; a million is past any file-descriptor limit.
        if !(1..=MAX_CONNECTIONS).contains(&max_connections) {
            return Err(err(
                "server.max_connections",
                format!("must be between 1 and {MAX_CONNECTIONS}"),
            ));
        }
        let max_connections_per_ip = raw
            .server
            .max_connections_per_ip
            .unwrap_or_else(|| default_per_ip(max_connections));
        if max_connections_per_ip == 0 {
            return Err(err(
                "server.max_connections_per_ip",
                "must be at least 1".into(),
            ));
        }

        let admin = match raw.admin.and_then(|a| a.listen) {
            None => None,
            Some(s) => Some(Listen::parse_in(&s, &base).map_err(|m| err("admin.listen", m))?),
        };
        if let Some(why) = admin.as_ref().and_then(|a| admin_problem(a, listen)) {
            return Err(err("admin.listen", why));
        }

        let store_path = raw
            .store
            .path
            .ok_or_else(|| err("store.path", "required".into()))?;
        // `state/new/`: a folder, by its slash, though it is not there yet. Taken as the
        // file `state/new`, which could not be made in a folder that is not there.
        if store_path.as_os_str().as_encoded_bytes().ends_with(b"/") {
            return Err(err(
                "store.path",
                format!(
                    "{} names a folder (it ends in /): name the database file, such as {}",
                    store_path.display(),
                    store_path.join("mutex.redb").display()
                ),
            ));
        }
        let store_path = rel(store_path);
        // `""` (the config's own folder) or a folder: the database could never open, and
        // the gateway would fail closed for good rather than say why at start.
        // A folder beside a journal of its name is a database replaced (by a restore gone
        // wrong): naming a file inside it would start an empty database beside the keys.
        if store_path.is_dir() {
            let journal = crate::mutex::journal::path_for(&store_path);
            let why = if journal.is_file() {
                format!(
                    "{} is a folder, beside the journal {}: the database file that was \
                     there is gone; restore it",
                    store_path.display(),
                    journal.display()
                )
            } else {
                format!(
                    "{} is a folder: name the database file, such as {}",
                    store_path.display(),
                    store_path.join("mutex.redb").display()
                )
            };
            return Err(err("store.path", why));
        }
        // In a folder anyone may write: anyone could take the database and its journal
        // away, or put an empty pair in their place, and the next start would free every
        // live key (the files' own 0600 does not stop a rename in their folder).
        if let Some(why) = crate::secrets::folder_open_to_others(&store_path, "a database") {
            return Err(err(
                "store.path",
                format!("{}: {why}", store_path.display()),
            ));
        }
        let ttl = duration("store.ttl", &raw.store.ttl, Duration::from_secs(300))?;
        if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(24 * 3600) {
            return Err(err("store.ttl", "must be between 1s and 24h".into()));
        }
        // A reserve may wait out the sync in progress and then its own: a disk whose
        // syncs take a second (an SD card wear-levelling) needs more than the default.
        let store_timeout = timeout(
            "store.timeout",
            &raw.store.timeout,
            crate::mutex::DEADLINE,
            MAX_STORE_TIMEOUT,
            " (longer, a gateway still serving on a disk that slow could be killed by its \
             watchdog, WatchdogSec=10s)",
        )?;

        let require = raw
            .auth
            .require
            .unwrap_or_default()
            .iter()
            .map(|m| match m.as_str() {
                "api_key" => Ok(Method::ApiKey),
                "hmac" => Ok(Method::Hmac),
                "bearer" => Ok(Method::Bearer),
                "mtls" => Ok(Method::Mtls),
                o => Err(err(
                    "auth.require",
                    format!("{o:?}: expected api_key, hmac, bearer or mtls"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cred = |p: Option<PathBuf>| p.map(|p| rel(secrets::credential_path(&p)));
        let mut auth = AuthConfig {
            config_file: file.to_path_buf(),
            api_keys_file: cred(raw.auth.api_keys_file),
            hmac_secrets_file: cred(raw.auth.hmac_secrets_file),
            bearer_tokens_file: cred(raw.auth.bearer_tokens_file),
            require,
            mtls: tls.client_ca.is_some(),
            api_keys: Vec::new(),
            hmac_secrets: Vec::new(),
            bearer_tokens: Vec::new(),
        };
        // The database in a file named for another use: a redb open fails on it at every
        // try, and the gateway fails closed for good where `check-config` said ok.
        let others = [
            ("server.cert", Some(&tls.cert)),
            ("server.key", Some(&tls.key)),
            ("server.client_ca", tls.client_ca.as_ref()),
            ("auth.api_keys_file", auth.api_keys_file.as_ref()),
            ("auth.hmac_secrets_file", auth.hmac_secrets_file.as_ref()),
            ("auth.bearer_tokens_file", auth.bearer_tokens_file.as_ref()),
        ];
        if let Some((key, _)) = others.iter().find(|(_, p)| *p == Some(&store_path)) {
            return Err(err(
                "store.path",
                format!(
                    "{} is also {key}: name a file of its own for the database",
                    store_path.display()
                ),
            ));
        }
        auth = auth.reload()?;
        // The authenticator's own rules, checked here so that `check-config` finds them.
        auth.authenticator().map_err(|e| match e {
            // Fail closed: a gateway that would accept anyone does not start.
            AuthConfigError::NoMethod => err(
                "auth",
                "no credential configured: set api_keys_file, hmac_secrets_file, \
                 bearer_tokens_file or server.client_ca"
                    .into(),
            ),
            AuthConfigError::RequiredNotConfigured(_) => err("auth.require", e.to_string()),
            AuthConfigError::SecretForTwoClients { second, .. } => {
                err(&format!("auth.{second}"), e.to_string())
            }
        })?;

        let executor = match raw.executor.kind.as_deref() {
            Some("http") => {
                let url = raw
                    .executor
                    .url
                    .ok_or_else(|| err("executor.url", "required when kind = \"http\"".into()))?;
                let cfg = crate::executor::HttpConfig {
                    // Never echoed: it may carry credentials.
                    url: url
                        .parse()
                        .map_err(|e| err("executor.url", format!("not a URL: {e}")))?,
                    timeout: duration(
                        "executor.timeout",
                        &raw.executor.timeout,
                        Duration::from_secs(10),
                    )?,
                    ca_file: raw.executor.ca_file.map(rel),
                };
                // A typo ("10ms" for "10s") would pass every other check and then time out
                // every real order: a 504, and its key held until the TTL.
                if cfg.timeout < MIN_TIMEOUT {
                    return Err(err(
                        "executor.timeout",
                        format!(
                            "must be at least {}: a shorter one times out every order \
                             (504, its key held)",
                            humantime::format_duration(MIN_TIMEOUT)
                        ),
                    ));
                }
                // An order still out when the drain at SIGTERM ends is abandoned: its key
                // stays pending, and a fill would lose its commit. So every order must be
                // able to end within the drain, with time left to settle it.
                let most = max_executor_timeout(store_timeout);
                if cfg.timeout > most {
                    return Err(err(
                        "executor.timeout",
                        format!(
                            "must be at most {}: at SIGTERM, orders in flight get {} to finish, \
                             store.timeout ({}) included",
                            humantime::format_duration(most),
                            humantime::format_duration(crate::gateway::DRAIN),
                            humantime::format_duration(store_timeout)
                        ),
                    ));
                }
                // A key that expires while its order is out no longer stands between a
                // retry and that order. Its TTL runs from the owner's clock reading, and
                // the Proceed may reach the gateway up to the owner's deadline later: only
                // then does the executor's timeout start.
                if ttl <= cfg.timeout + store_timeout {
                    return Err(err(
                        "store.ttl",
                        format!(
                            "must be longer than executor.timeout ({}) and store.timeout ({}), \
                             the longest a reserve may wait for the mutex",
                            humantime::format_duration(cfg.timeout),
                            humantime::format_duration(store_timeout)
                        ),
                    ));
                }
                // The executor's own checks, and its CA file read, now rather than at start.
                crate::executor::HttpExecutor::new(cfg.clone()).map_err(|e| {
                    use crate::executor::ExecutorError as E;
                    let key = match e {
                        E::Url | E::Port | E::UserInfo => "executor.url",
                        E::Timeout => "executor.timeout",
                        E::CaFile { .. } => "executor.ca_file",
                        E::Tls(_) => "executor",
                    };
                    err(key, e.to_string())
                })?;
                // A private CA is only for an https executor: beside an http:// URL it
                // trusts nothing, and orders the operator believes are pinned to that CA
                // go out in cleartext. Refused, not ignored, as the paper executor's stray
                // keys are. After the executor's own checks, so that a URL it cannot post
                // to at all is named for that.
                if cfg.ca_file.is_some() && cfg.url.scheme_str() != Some("https") {
                    return Err(err(
                        "executor.ca_file",
                        "only used with an https:// executor.url; this one sends orders in \
                         cleartext"
                            .into(),
                    ));
                }
                ExecutorKind::Http(cfg)
            }
            kind @ (None | Some("paper")) => {
                // Set for an HTTP executor that is not selected: orders would be simulated
                // while the operator believes they go out. Refused, not ignored.
                let stray = [
                    ("executor.url", raw.executor.url.is_some()),
                    ("executor.ca_file", raw.executor.ca_file.is_some()),
                    ("executor.timeout", raw.executor.timeout.is_some()),
                ];
                // Nor is paper a default: a file that names no executor (a section lost in
                // an edit, a config written for another version) placed no order while
                // its senders got 200s. The embedded defaults say `paper`.
                if kind.is_none() && !stray.iter().any(|(_, set)| *set) {
                    return Err(err(
                        "executor.kind",
                        "required: \"http\" sends orders to executor.url, \"paper\" only \
                         simulates fills (no order leaves this host)"
                            .into(),
                    ));
                }
                if let Some((key, _)) = stray.iter().find(|(_, set)| *set) {
                    return Err(match kind {
                        None => err(
                            "executor.kind",
                            format!(
                                "required when {key} is set: \"http\" sends orders there, \
                                 \"paper\" only simulates fills"
                            ),
                        ),
                        Some(_) => err(
                            key,
                            "only used by kind = \"http\"; the paper executor sends no order"
                                .into(),
                        ),
                    });
                }
                ExecutorKind::Paper
            }
            Some(o) => {
                return Err(err(
                    "executor.kind",
                    format!("{o:?}: expected \"http\" or \"paper\""),
                ));
            }
        };
        let on_unknown_outcome = match raw.executor.on_unknown_outcome.as_deref() {
            None | Some("hold") => OnUnknown::Hold,
            Some("release") => OnUnknown::Release,
            Some(o) => {
                return Err(err(
                    "executor.on_unknown_outcome",
                    format!("{o:?}: expected \"hold\" or \"release\""),
                ));
            }
        };

        // A slower bucket refills in more than an hour, the longest `Retry-After` given
        // (`limits::MAX_RETRY_AFTER`): a sender that waits as told would be refused again.
        if let Some(r) = raw.limits.rate_per_s
            && !(r.is_finite() && r >= crate::gateway::limits::MIN_RATE_PER_S)
        {
            return Err(err(
                "limits.rate_per_s",
                "must be a number of at least 1/3600 (0.000278: one request an hour)".into(),
            ));
        }
        let burst = match (raw.limits.burst, raw.limits.rate_per_s) {
            (Some(0), _) => return Err(err("limits.burst", "must be at least 1".into())),
            (Some(_), None) => {
                return Err(err(
                    "limits.burst",
                    "only used with limits.rate_per_s, which is not set".into(),
                ));
            }
            (b, _) => b.unwrap_or(20),
        };
        // An empty list is refused, not read as "no allowlist": an operator who wrote
        // `allow_ips = []` meant to let nobody in, and must not open the gateway to all.
        if raw.limits.allow_ips.as_ref().is_some_and(Vec::is_empty) {
            return Err(err(
                "limits.allow_ips",
                "an empty list; remove the key to allow every address".into(),
            ));
        }
        let allow_ips =
            crate::gateway::limits::Allowlist::parse(&raw.limits.allow_ips.unwrap_or_default())
                .map_err(|e| err("limits.allow_ips", e))?;
        let capacity = raw.limits.capacity.unwrap_or(1_000_000);
        if capacity < 2 {
            return Err(err(
                "limits.capacity",
                "must be at least 2: a signed trade takes two places (its key and its \
                 signature's guard), and new trades are refused from fewer free"
                    .into(),
            ));
        }

        Ok(Config {
            source: Some(file.to_path_buf()),
            listen,
            tls,
            duplicate_response,
            max_connections,
            max_connections_per_ip,
            handshake_timeout,
            header_timeout,
            admin,
            store_path,
            ttl,
            store_timeout,
            capacity,
            auth,
            executor,
            on_unknown_outcome,
            rate_per_s: raw.limits.rate_per_s,
            burst,
            allow_ips,
            require_client_key: raw.keys.require_client_key.unwrap_or(false),
            restart_only: RestartOnly::default(),
            flagged: Vec::new(),
        })
    }

    /// `--listen`, in place of `server.listen`.
    pub fn set_listen(&mut self, addr: SocketAddr) {
        self.listen = addr;
        self.flagged.push(("server.listen", "--listen"));
    }

    /// `--admin`, in place of `[admin] listen`.
    pub fn set_admin(&mut self, listen: Listen) {
        self.admin = Some(listen);
        self.flagged.push(("admin.listen", "--admin"));
    }

    /// The admin face checked again after `--listen` and `--admin` (the load checked the
    /// file's): what it would refuse there, it refuses from a flag too, naming where the
    /// address came from.
    pub fn check_flags(&self) -> Result<(), String> {
        match self
            .admin
            .as_ref()
            .and_then(|a| admin_problem(a, self.listen))
        {
            Some(why) => Err(format!("{}: {why}", self.origin("admin.listen"))),
            None => Ok(()),
        }
    }

    /// Where a key's value came from, for an error about it: the flag that set it, else
    /// the file (or the embedded defaults) and the key.
    pub fn origin(&self, key: &str) -> String {
        if let Some((_, flag)) = self.flagged.iter().find(|(k, _)| *k == key) {
            return (*flag).to_string();
        }
        match &self.source {
            Some(p) => format!("{}: {key}", p.display()),
            None => format!("the embedded defaults: {key}"),
        }
    }

    /// The configuration a reload (SIGHUP) applies, and the keys it does not: the file
    /// read and checked again, as `check-config` (the unit's `ExecReload=`) has just done.
    /// It applies the certificate, key, client CA and `[auth]` (the secrets files, and
    /// which there are: a credential kind taken out stops authenticating). The rest stays
    /// as the gateway started; the keys the file now sets otherwise are returned, for the
    /// caller to say that a restart applies them. Refusing the whole reload for them would
    /// keep a revoked secret or an expiring certificate in use until a restart. The
    /// embedded defaults: their secret read again.
    pub fn reload(&self) -> Result<Reload, ConfigError> {
        let Some(path) = &self.source else {
            let auth = self.auth.reload()?;
            return Ok(Reload {
                applied: Config {
                    auth,
                    ..self.clone()
                },
                pending: Vec::new(),
                overridden: Vec::new(),
                capacity: self.capacity,
            });
        };
        let next = Config::load(path)?;
        let mut pending = self.restart_only.changed(&next.restart_only);
        // The same database written another way (relative, absolute, through `..` or a
        // link): nothing to restart for, and no keys left behind, which the reload would
        // otherwise say.
        let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        if real(&next.store_path) == real(&self.store_path) {
            pending.retain(|k| k != "store.path");
        }
        // A key a flag set (`--listen`, `--admin`) stays the flag's at a restart too: its
        // change in the file is not one a restart applies, as the reload would say.
        let flag_of = |k: &str| self.flagged.iter().find(|(key, _)| *key == k).map(|f| f.1);
        let overridden = pending
            .iter()
            .filter_map(|k| flag_of(k).map(|flag| format!("{k} (set by {flag})")))
            .collect();
        pending.retain(|k| flag_of(k).is_none());
        let capacity = next.capacity;
        let applied = Config {
            tls: next.tls,
            auth: next.auth,
            ..self.clone()
        };
        Ok(Reload {
            applied,
            pending,
            overridden,
            capacity,
        })
    }

    /// The embedded defaults (`hoox-edge serve` with no config): state in `state_dir`, a
    /// self-signed certificate and a random secret generated there on first start, the
    /// paper executor, 127.0.0.1:8443, admin on 127.0.0.1:9980.
    pub fn embedded(state_dir: &Path) -> Result<Config, ConfigError> {
        // What errors name in place of a file: there is none, and a `config.toml` named in
        // the state folder would send the operator looking for it.
        let file = PathBuf::from(format!("{} (embedded defaults)", state_dir.display()));
        let err = |key: &str, msg: String| ConfigError::new(&file, key, msg);
        let tls_dir = state_dir.join("tls");
        let secrets = state_dir.join("secrets");
        // A folder another user made (a first run under sudo) is said to be one.
        let state_err = |p: &Path, e: std::io::Error| {
            let whose = match e.kind() {
                std::io::ErrorKind::PermissionDenied => {
                    ": is the state folder another user's (made by a run under sudo)? Give \
                     it to this user, or choose another with --state-dir"
                }
                _ => "",
            };
            err("(state)", format!("{}: {e}{whose}", p.display()))
        };
        for d in [state_dir, &tls_dir, &secrets] {
            create_private_dir(d).map_err(|e| state_err(d, e))?;
        }
        // Looked at, not guessed: what could not be looked at read as missing, and was made
        // again, failing as `server.cert`'s "Permission denied". Either half of the pair
        // missing makes both.
        let there = |p: &Path| p.try_exists().map_err(|e| state_err(p, e));
        if !there(&tls_dir.join("cert.pem"))? || !there(&tls_dir.join("key.pem"))? {
            crate::gateway::tls::generate_self_signed(
                &tls_dir,
                &crate::gateway::tls::LOOPBACK_NAMES.map(String::from),
            )
            .map_err(|e| err("server.cert", e.to_string()))?;
        }
        let secret = secrets.join("secret");
        if !there(&secret)? {
            let token = random_token().map_err(|e| err("auth", e))?;
            write_private(&secret, &format!("{token}\n"))
                .map_err(|e| err("auth", format!("{}: {e}", secret.display())))?;
        }
        // The header the first-run curl line sends, made again from the secret whenever it
        // does not carry it: a start killed between the two writes, a deleted header, or a
        // secret deleted for a new one would otherwise leave that line getting 401 (and the
        // retired secret on disk). A convenience file: failing to write it is a warning. A
        // secret that does not load is left for `from_raw` to name.
        let header = secrets.join("curl-auth.header");
        let bearer = || {
            let first = crate::secrets::load_secrets(&secret)
                .ok()?
                .into_iter()
                .next()?;
            let token = String::from_utf8(first.expose().into()).ok()?;
            Some(format!("Authorization: Bearer {token}\n"))
        };
        // Made again too when others may read it (a `chmod` by hand): the secret file
        // itself is refused so, and this one holds the same secret.
        let private = || {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(&header).is_ok_and(|m| m.permissions().mode() & 0o077 == 0)
        };
        if let Some(bearer) = bearer()
            && (std::fs::read_to_string(&header).ok().as_ref() != Some(&bearer) || !private())
            && let Err(e) = write_private(&header, &bearer)
        {
            log::warn!("{}: {e}", header.display());
        }
        let text = EMBEDDED.to_string();
        let raw: RawFile = toml::from_str(&text).map_err(|e| err("(embedded)", e.to_string()))?;
        let mut c = Self::from_raw(raw, &file, state_dir)?;
        c.source = None;
        Ok(c)
    }
}

/// Whether two listeners on one port cannot both bind, as Linux has it: the same address, a
/// wildcard of the same family, or IPv6's wildcard, which takes IPv4 too (dual stack, as
/// the listeners are bound). `0.0.0.0` and `::1` live side by side.
fn binds_overlap(a: std::net::IpAddr, b: std::net::IpAddr) -> bool {
    use std::net::IpAddr::{V4, V6};
    // `[::ffff:127.0.0.1]` binds 127.0.0.1, as the kernel maps it.
    let (a, b) = (a.to_canonical(), b.to_canonical());
    a == b
        || match (a, b) {
            (V4(_), V4(_)) | (V6(_), V6(_)) => a.is_unspecified() || b.is_unspecified(),
            (V6(v6), V4(_)) | (V4(_), V6(v6)) => v6.is_unspecified(),
        }
}

/// What a reload (SIGHUP) makes of the file ([`Config::reload`]).
#[derive(Debug)]
pub struct Reload {
    /// The running configuration with what a reload applies taken from the file.
    pub applied: Config,
    /// The `section.key`s the file changed that only a restart applies, in order.
    pub pending: Vec<String>,
    /// Those the file changed that a flag sets (`server.listen (set by --listen)`): the
    /// flag's at a restart too, so not pending.
    pub overridden: Vec<String>,
    /// `limits.capacity` as a restart would read it, for the reload to say what it means
    /// for the keys live now.
    pub capacity: usize,
}

/// A config file's settings but the ones a reload applies (`Config::reload`), as written.
/// Its Debug shows none of them: `executor.url` may carry credentials.
#[derive(Clone, Default)]
struct RestartOnly(toml::Table);

impl std::fmt::Debug for RestartOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RestartOnly(..)")
    }
}

impl RestartOnly {
    /// `text` has parsed as a config file already, so it parses as a table; were it not,
    /// nothing would compare equal to the empty table but another such.
    fn of(text: &str) -> Self {
        let mut t: toml::Table = toml::from_str(text).unwrap_or_default();
        t.remove("auth");
        if let Some(server) = t.get_mut("server").and_then(toml::Value::as_table_mut) {
            for reloaded in ["cert", "key", "client_ca"] {
                server.remove(reloaded);
            }
        }
        RestartOnly(t)
    }

    /// The `section.key`s written otherwise in `next`, in order (as written: `"300s"` and
    /// `"5m"` differ). A section absent is as one empty.
    fn changed(&self, next: &RestartOnly) -> Vec<String> {
        changed_keys(&self.0, &next.0)
    }
}

fn changed_keys(a: &toml::Table, b: &toml::Table) -> Vec<String> {
    let empty = toml::Value::Table(toml::Table::new());
    let names: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let mut changed = Vec::new();
    for name in names {
        match (a.get(name).unwrap_or(&empty), b.get(name).unwrap_or(&empty)) {
            (toml::Value::Table(x), toml::Value::Table(y)) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                let differ = keys.into_iter().filter(|k| x.get(*k) != y.get(*k));
                changed.extend(differ.map(|k| format!("{name}.{k}")));
            }
            (x, y) if x != y => changed.push(name.clone()),
            _ => {}
        }
    }
    changed
}

/// The embedded defaults, as a config file relative to the state folder.
const EMBEDDED: &str = r#"
[server]
listen = "127.0.0.1:8443"
cert = "tls/cert.pem"
key = "tls/key.pem"

[admin]
listen = "127.0.0.1:9980"

[store]
path = "mutex.redb"
ttl = "300s"

[auth]
api_keys_file = "secrets/secret"
hmac_secrets_file = "secrets/secret"
bearer_tokens_file = "secrets/secret"

[executor]
kind = "paper"
"#;

/// `300s`, `10s`, `250ms`, `5m`, `1h`: a number and a unit, nothing else.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{s:?}: missing unit (ms, s, m, h)"))?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?}: expected a number and a unit (ms, s, m, h)"))?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        // "1.5s": the unit is not the problem.
        _ if unit.starts_with(['.', ',']) => {
            return Err(format!(
                "{s:?}: a whole number is needed: use a smaller unit (\"1500ms\" for \"1.5s\")"
            ));
        }
        _ => return Err(format!("{s:?}: unit must be ms, s, m or h")),
    };
    ms.map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?}: too large"))
}

/// The shortest timeout of any kind (`server.handshake_timeout`, `server.header_timeout`,
/// `executor.timeout`, `store.timeout`): below it a value is a typo for seconds, not a
/// setting.
const MIN_TIMEOUT: Duration = Duration::from_millis(100);

/// The longest `store.timeout`. A gateway serves trades while its owner's turns (a write
/// each) end within this deadline; the supervisor pings every second and sends WATCHDOG=1
/// once a turn ends within the ping's wait. So with turns up to 5 s long, still serving, a
/// WATCHDOG=1 goes every 6 s at most, within the packaged `WatchdogSec=10s`; with turns of
/// 9 s it would not.
const MAX_STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest `executor.timeout`: an order must end within the drain at SIGTERM, counted
/// from its reserve (which may wait `store.timeout`), with 3 s left to settle it: 25 s at
/// the default `store.timeout`.
fn max_executor_timeout(store_timeout: Duration) -> Duration {
    crate::gateway::DRAIN.saturating_sub(Duration::from_secs(3) + store_timeout)
}

/// One address's share of `max_connections` when the config names none: a quarter (256 of
/// the default 1024), and at least 16, or all of them when there are fewer. So a runaway
/// host leaves the signal engine most of the slots, and a small box is not made to refuse
/// an engine's few connections.
fn default_per_ip(max_connections: usize) -> usize {
    (max_connections / 4).max(max_connections.min(16))
}

/// A fresh 256-bit secret, hex-encoded.
pub fn random_token() -> Result<String, String> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| format!("no randomness: {e}"))?;
    Ok(hex::encode(b))
}

/// Why the admin face cannot be at `admin` beside webhooks at `listen`, if it cannot.
fn admin_problem(admin: &Listen, listen: SocketAddr) -> Option<String> {
    match admin {
        // Both on one address and port: the second bind fails at every start (exit 1,
        // restarted).
        Listen::Tcp(a) if a.port() == listen.port() && a.port() != 0 => {
            binds_overlap(a.ip(), listen.ip()).then(|| {
                format!(
                    "{a} is where server.listen ({listen}) takes webhooks: give it a port of \
                     its own"
                )
            })
        }
        Listen::Tcp(_) => None,
        // A socket's path taken by a file or a folder: `serve` would fail to bind at every
        // start. In a folder anyone may write: anyone could put a socket of their own there,
        // and answer the operator's `halt` with a success while the gateway trades on.
        Listen::Unix(p) => crate::admin::taken_by_other_than_a_socket(p)
            .map(|why| format!("{why}: name a path of its own"))
            .or_else(|| {
                crate::secrets::folder_open_to_others(p, "a socket")
                    .map(|why| format!("{}: {why}", p.display()))
            }),
    }
}

/// Creates a directory readable by its owner only (no-op if it exists).
pub fn create_private_dir(d: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(d)
}

/// Writes a file readable by its owner only. Written whole beside it first, then renamed
/// over it: a file that was there keeps neither its mode (a key once left 0644 would
/// otherwise stay so, with the new key in it) nor, if it was a link, its target; and a
/// crash leaves the old file or the new one, never half of one.
pub fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut draft = path.as_os_str().to_owned();
    draft.push(".new");
    let draft = PathBuf::from(draft);
    // One left by a write that stopped midway is ours to replace.
    match std::fs::remove_file(&draft) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&draft)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&draft, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// README's "Configure" block is what operators copy: every key in it is one the
    /// gateway knows, of its type (`deny_unknown_fields`), and every file it names is one
    /// the package makes (a `bearer_tokens_file` left in it failed check-config).
    #[test]
    fn the_readmes_config_is_one_the_gateway_reads() {
        let readme = include_str!("../README.md");
        let from = readme
            .find("\n## Configure")
            .expect("README has a Configure section");
        let block = &readme[from..];
        let start = block.find("```toml\n").expect("a toml block") + "```toml\n".len();
        let text = &block[start..start + block[start..].find("```").expect("closed")];
        assert!(
            text.contains("\n[auth]") && text.contains("\n[executor]"),
            "{text}"
        );
        toml::from_str::<RawFile>(text).unwrap_or_else(|e| panic!("{e}"));
        let packaged = [
            "/etc/hoox-edge/secrets/api-keys",
            "/etc/hoox-edge/secrets/hmac",
        ];
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            if let Some(path) = line.split('"').nth(1).filter(|p| p.contains("/secrets/")) {
                assert!(
                    packaged.contains(&path),
                    "{path}: the package makes no such file"
                );
            }
        }
    }

    /// A config file anyone may write is anyone's to point at a CA, secrets or an
    /// executor of their own: refused, named, with the remedy; so is one in a folder
    /// anyone may write (without the sticky bit). The files it names are refused so
    /// already; the file naming them was not.
    #[test]
    fn a_config_file_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = state();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, EMBEDDED).unwrap();
        let chmod = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
        chmod(&path, 0o664).unwrap();
        assert!(Config::load(&path).is_ok());
        chmod(&path, 0o666).unwrap();
        let e = Config::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("(file)") && e.contains("writable by everyone (mode 666)"),
            "{e}"
        );
        assert!(e.contains("chmod o-w"), "{e}");
        chmod(&path, 0o644).unwrap();
        chmod(dir.path(), 0o777).unwrap();
        let e = Config::load(&path).unwrap_err().to_string();
        assert!(e.contains("settings of their own in its place"), "{e}");
        chmod(dir.path(), 0o1777).unwrap();
        assert!(Config::load(&path).is_ok());
        chmod(dir.path(), 0o700).unwrap();
    }

    #[test]
    fn one_address_gets_a_quarter_of_the_slots_and_at_least_sixteen() {
        let shares: Vec<_> = [1024, 128, 40, 8, 2].map(default_per_ip).into();
        assert_eq!(shares, [256, 32, 16, 8, 2]);
    }

    /// A reload applies the file's `[auth]` and certificate paths, and names any other
    /// change, which it leaves to a restart. The settings kept for that comparison show no
    /// value in a Debug: the executor's URL may carry credentials.
    #[test]
    fn a_reload_applies_auth_and_names_what_takes_a_restart() {
        let dir = state();
        let path = dir.path().join("config.toml");
        let with_url = EMBEDDED.replace(
            "[executor]\nkind = \"paper\"",
            "[executor]\nkind = \"http\"\nurl = \"http://127.0.0.1:9/o?token=s3cret\"",
        );
        std::fs::write(&path, &with_url).unwrap();
        let running = Config::load(&path).unwrap();
        assert_eq!(running.auth.bearer_tokens.len(), 1);
        assert!(!format!("{running:?}").contains("s3cret"), "{running:?}");

        // A credential kind taken out, and the TTL and store.timeout changed: the first
        // applied, the others named and not applied.
        let edited = with_url
            .replace("bearer_tokens_file = \"secrets/secret\"\n", "")
            .replace("ttl = \"300s\"", "ttl = \"30s\"\ntimeout = \"4s\"")
            .replace("[executor]", "[limits]\nrate_per_s = 5.0\n[executor]");
        std::fs::write(&path, &edited).unwrap();
        let Reload {
            applied: next,
            pending,
            ..
        } = running.reload().unwrap();
        assert!(next.auth.bearer_tokens.is_empty());
        assert_eq!(next.auth.api_keys.len(), 1);
        assert_eq!(pending, ["limits.rate_per_s", "store.timeout", "store.ttl"]);
        assert_eq!(
            (next.ttl, next.store_timeout, next.rate_per_s),
            (running.ttl, running.store_timeout, running.rate_per_s)
        );
        // Compared with what it started on, not with the last reload.
        assert_eq!(next.reload().unwrap().pending, pending);
        // The same database written another way is no change to restart for: absolute,
        // or through a link to its folder.
        let db = dir.path().join("mutex.redb");
        std::fs::write(&db, "").unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("link")).unwrap();
        for other in [format!("{db:?}"), "\"link/mutex.redb\"".to_string()] {
            let same = edited.replace("path = \"mutex.redb\"", &format!("path = {other}"));
            assert_ne!(same, edited);
            std::fs::write(&path, &same).unwrap();
            assert_eq!(running.reload().unwrap().pending, pending, "{other}");
        }
        let moved = edited.replace("path = \"mutex.redb\"", "path = \"moved.redb\"");
        std::fs::write(&path, &moved).unwrap();
        assert_eq!(
            running.reload().unwrap().pending,
            [
                "limits.rate_per_s",
                "store.path",
                "store.timeout",
                "store.ttl"
            ]
        );

        // A key a flag overrides is the flag's at a restart too: not one to restart for.
        let mut flagged = running.clone();
        flagged.set_listen("127.0.0.1:0".parse().unwrap());
        let relisten = moved.replace("127.0.0.1:8443", "127.0.0.1:8444");
        assert_ne!(relisten, moved);
        std::fs::write(&path, &relisten).unwrap();
        assert_eq!(
            running.reload().unwrap().pending,
            [
                "limits.rate_per_s",
                "server.listen",
                "store.path",
                "store.timeout",
                "store.ttl"
            ]
        );
        let Reload {
            pending,
            overridden,
            ..
        } = flagged.reload().unwrap();
        assert_eq!(
            pending,
            [
                "limits.rate_per_s",
                "store.path",
                "store.timeout",
                "store.ttl"
            ]
        );
        assert_eq!(overridden, ["server.listen (set by --listen)"]);

        // The embedded defaults have no file to read again: their secret is.
        let embedded = Config::embedded(dir.path()).unwrap();
        let Reload {
            applied: again,
            pending,
            ..
        } = embedded.reload().unwrap();
        assert_eq!(again.auth.api_keys.len(), 1);
        assert!(pending.is_empty());
    }

    /// A reload applies a change of what it reloads, not only the files as they were: the
    /// certificate and key at the paths the file now names (README: a reload "applies its
    /// `[auth]` and certificate paths"), and, under the embedded defaults, a secret
    /// rotated in their secrets file.
    #[test]
    fn a_reload_applies_new_certificate_paths_and_a_rotated_secret() {
        let dir = state();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, EMBEDDED).unwrap();
        let running = Config::load(&path).unwrap();
        // The certificate moved to new files (fs::copy keeps their 0600), the file pointed
        // at them.
        let tls = dir.path().join("tls");
        std::fs::copy(tls.join("cert.pem"), tls.join("next-cert.pem")).unwrap();
        std::fs::copy(tls.join("key.pem"), tls.join("next-key.pem")).unwrap();
        let moved = EMBEDDED
            .replace("tls/cert.pem", "tls/next-cert.pem")
            .replace("tls/key.pem", "tls/next-key.pem");
        std::fs::write(&path, moved).unwrap();
        let Reload {
            applied: next,
            pending,
            ..
        } = running.reload().unwrap();
        assert!(pending.is_empty(), "{pending:?}");
        assert!(
            next.tls.cert.ends_with("tls/next-cert.pem"),
            "{:?}",
            next.tls
        );
        assert!(next.tls.key.ends_with("tls/next-key.pem"), "{:?}", next.tls);

        // The embedded defaults: the secret rotated in place is the one the reload loads.
        let embedded = Config::embedded(dir.path()).unwrap();
        let old = embedded.auth.api_keys[0].expose().to_vec();
        write_private(
            &dir.path().join("secrets/secret"),
            "a-new-secret-of-32-bytes-or-more!!\n",
        )
        .unwrap();
        let again = embedded.reload().unwrap().applied;
        let now: Vec<&[u8]> = again.auth.api_keys.iter().map(Secret::expose).collect();
        assert_eq!(now, [&b"a-new-secret-of-32-bytes-or-more!!"[..]]);
        assert_ne!(now, [&old[..]]);
    }

    #[test]
    fn changed_keys_name_each_key_and_take_an_absent_section_as_empty() {
        let t = |s: &str| -> toml::Table { toml::from_str(s).unwrap() };
        let a = t("top = 1\n[s]\nx = 1\ny = 2\n[e]\n");
        let b = t("top = 2\n[s]\nx = 1\ny = 3\nz = 0\n");
        assert_eq!(changed_keys(&a, &b), ["s.y", "s.z", "top"]);
        assert!(changed_keys(&a, &a).is_empty());
    }

    /// A state folder as the embedded defaults leave it: a certificate, its key, a secret.
    fn state() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        Config::embedded(dir.path()).unwrap();
        dir
    }

    /// The embedded defaults, changed by `edit`, checked as a config file in `dir` would be.
    fn checked_in(dir: &Path, edit: impl FnOnce(&mut RawFile)) -> Result<Config, ConfigError> {
        let mut raw: RawFile = toml::from_str(EMBEDDED).unwrap();
        edit(&mut raw);
        Config::from_raw(raw, &dir.join("config.toml"), dir)
    }

    fn checked(edit: impl FnOnce(&mut RawFile)) -> Result<Config, ConfigError> {
        checked_in(state().path(), edit)
    }

    /// What only fails at `serve`'s start, or leaves it failing closed for good, refused
    /// by the load that `check-config` makes too: the admin face on the webhooks' port, a
    /// socket path too long to bind, a database path that is a folder, or one in a folder
    /// anyone may write.
    #[test]
    fn what_serve_could_never_start_with_is_a_config_error() {
        let admin = |listen: &str| {
            let listen = listen.to_string();
            checked(move |r| {
                r.server.listen = Some("0.0.0.0:8443".into());
                r.admin = Some(RawAdmin {
                    listen: Some(listen),
                });
            })
        };
        let e = admin("127.0.0.1:8443").expect_err("under 0.0.0.0 on its port");
        assert_eq!(e.key, "admin.listen", "{e}");
        assert!(e.message.contains("give it a port of its own"), "{e}");
        // Beside 0.0.0.0, ::1 binds the same port (0.2.11 ran such a config).
        assert!(admin("[::1]:8443").is_ok());
        assert!(admin("127.0.0.1:9980").is_ok());
        use std::net::IpAddr;
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for (a, b, overlap) in [
            ("0.0.0.0", "127.0.0.1", true),
            ("::", "::1", true),
            ("::", "127.0.0.1", true),
            ("::", "0.0.0.0", true),
            ("127.0.0.1", "127.0.0.1", true),
            ("0.0.0.0", "::1", false),
            ("127.0.0.1", "::1", false),
            ("127.0.0.1", "127.0.0.2", false),
            // IPv4-mapped: the kernel binds the IPv4 address.
            ("::ffff:127.0.0.1", "127.0.0.1", true),
            ("::ffff:0.0.0.0", "127.0.0.1", true),
        ] {
            assert_eq!(binds_overlap(ip(a), ip(b)), overlap, "{a} {b}");
            assert_eq!(binds_overlap(ip(b), ip(a)), overlap, "{b} {a}");
        }
        // A file where the socket would go.
        let e = admin("unix:tls/cert.pem").expect_err("a file for a socket");
        assert!(e.message.contains("exists and is not a socket"), "{e}");
        let long = format!("unix:/run/{}.sock", "s".repeat(100));
        let e = admin(&long).expect_err("a socket path of 110 bytes");
        assert_eq!(e.key, "admin.listen", "{e}");
        assert!(e.message.contains("is 110 bytes"), "{e}");
        assert!(admin(&format!("unix:/run/{}.sock", "s".repeat(97))).is_ok());
        // In a folder anyone may write, without the sticky bit: refused, naming it.
        let open = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let sock = open.path().join("admin.sock");
        let e = admin(&format!("unix:{}", sock.display())).expect_err("an open folder");
        assert_eq!(e.key, "admin.listen", "{e}");
        assert!(e.message.contains("writable by everyone"), "{e}");
        // So is a database there: anyone could put an empty one in its place.
        let db = || open.path().join("mutex.redb");
        let e = checked(|r| r.store.path = Some(db())).expect_err("a database in an open folder");
        assert_eq!(e.key, "store.path", "{e}");
        assert!(e.message.contains("writable by everyone"), "{e}");
        std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(
            admin(&format!("unix:{}", sock.display())).is_ok(),
            "sticky, as /tmp"
        );
        assert!(
            checked(|r| r.store.path = Some(db())).is_ok(),
            "sticky, as /tmp"
        );
        for folder in ["", ".", "tls"] {
            let e = checked(|r| r.store.path = Some(folder.into())).expect_err(folder);
            assert_eq!(e.key, "store.path", "{e}");
            assert!(
                e.message.contains("is a folder: name the database file"),
                "{e}"
            );
        }
        // A host name, or a port past 65535: what a listen address is, said.
        for listen in ["localhost:8443", "127.0.0.1:70000", "127.0.0.1"] {
            let e = checked(|r| r.server.listen = Some(listen.into())).expect_err(listen);
            assert_eq!(e.key, "server.listen", "{e}");
            assert!(e.message.contains("a host name is not looked up"), "{e}");
        }
        // A folder by its slash, though it is not there yet; a file the config names for
        // another use (it could never open as a database: failing closed for good).
        let e = checked(|r| r.store.path = Some("new/".into())).expect_err("new/");
        assert_eq!(e.key, "store.path", "{e}");
        assert!(e.message.contains("names a folder (it ends in /)"), "{e}");
        for (path, other) in [
            ("tls/cert.pem", "server.cert"),
            ("tls/key.pem", "server.key"),
            ("secrets/secret", "auth.api_keys_file"),
        ] {
            let e = checked(|r| r.store.path = Some(path.into())).expect_err(path);
            assert_eq!(e.key, "store.path", "{e}");
            assert!(e.message.contains(&format!("is also {other}")), "{e}");
        }
        // A folder where the database was, its journal beside it: a file inside it would
        // be an empty database. Restore it, says the error.
        let dir = state();
        std::fs::create_dir(dir.path().join("gone.redb")).unwrap();
        std::fs::write(dir.path().join("gone.redb-journal"), b"").unwrap();
        let e = checked_in(dir.path(), |r| r.store.path = Some("gone.redb".into()))
            .expect_err("a folder for the database");
        assert_eq!(e.key, "store.path", "{e}");
        assert!(e.message.contains("beside the journal"), "{e}");
        assert!(!e.message.contains("such as"), "{e}");
    }

    /// An HTTP executor's config with `timeout`, and `ttl` if given.
    fn http_executor(timeout: &str, ttl: Option<&str>) -> Result<Config, ConfigError> {
        http_executor_waiting(timeout, ttl, None)
    }

    /// The same, with `store.timeout` if given.
    fn http_executor_waiting(
        timeout: &str,
        ttl: Option<&str>,
        store_timeout: Option<&str>,
    ) -> Result<Config, ConfigError> {
        let (timeout, ttl) = (timeout.to_string(), ttl.map(String::from));
        let store_timeout = store_timeout.map(String::from);
        checked(move |r| {
            r.executor.kind = Some("http".into());
            r.executor.url = Some("http://127.0.0.1:9/order".into());
            r.executor.timeout = Some(timeout);
            if ttl.is_some() {
                r.store.ttl = ttl;
            }
            r.store.timeout = store_timeout;
        })
    }

    /// An order must be able to end within the drain at SIGTERM: 25 s at most.
    #[test]
    fn the_executor_timeout_ends_within_the_drain() {
        let http = |timeout| http_executor(timeout, None);
        assert!(http("25s").is_ok());
        let e = http("25001ms").expect_err("accepted");
        assert_eq!(e.key, "executor.timeout");
        assert!(e.message.contains("at most 25s"), "{e}");
        // The reserve's wait counts: with the longest store.timeout, 3 s less.
        let waiting = |timeout| http_executor_waiting(timeout, None, Some("5s"));
        assert!(waiting("22s").is_ok());
        let e = waiting("22001ms").expect_err("accepted");
        assert_eq!(e.key, "executor.timeout");
        assert!(e.message.contains("at most 22s"), "{e}");
        assert!(e.message.contains("store.timeout (5s)"), "{e}");
    }

    /// `store.timeout`: the mutex's 2 s deadline unless set, between 100 ms and 5 s.
    #[test]
    fn the_store_timeout_is_the_mutex_deadline_within_bounds() {
        let c = checked(|_| {}).unwrap();
        assert_eq!(c.store_timeout, crate::mutex::DEADLINE);
        let with = |v: &str| {
            let v = v.to_string();
            checked(move |r| r.store.timeout = Some(v))
        };
        assert_eq!(
            with("100ms").unwrap().store_timeout,
            Duration::from_millis(100)
        );
        assert_eq!(with("5s").unwrap().store_timeout, Duration::from_secs(5));
        for bad in ["99ms", "5001ms", "0s"] {
            let e = with(bad).expect_err(bad);
            assert_eq!(e.key, "store.timeout", "{e}");
            assert!(e.message.contains("between 100ms and 5s"), "{bad}: {e}");
        }
        let e = with("2").expect_err("no unit");
        assert_eq!(e.key, "store.timeout", "{e}");
    }

    /// A typo of "10ms" for "10s" is refused, as the server's timeouts below 100 ms are:
    /// accepted, it would time out every real order (a 504, its key held).
    #[test]
    fn the_executor_timeout_has_the_same_floor_as_the_others() {
        let http = |timeout| http_executor(timeout, None);
        assert!(http("100ms").is_ok());
        for typo in ["10ms", "99ms", "0s"] {
            let e = http(typo).expect_err(typo);
            assert_eq!(e.key, "executor.timeout", "{typo}: {e}");
            assert!(e.message.contains("at least 100ms"), "{typo}: {e}");
            assert!(e.file.ends_with("config.toml"), "{typo}: {e}");
        }
    }

    /// A private CA beside an http:// executor would leave orders in cleartext while the
    /// operator believes them pinned to that CA: refused naming `executor.ca_file`. With an
    /// https:// URL the same CA file is taken.
    #[test]
    fn a_ca_file_needs_an_https_executor() {
        let dir = state();
        // A PEM certificate to trust: the state folder's own.
        let ca = dir.path().join("tls/cert.pem");
        let with_ca = |url: &str| {
            let (url, ca) = (url.to_string(), ca.clone());
            checked_in(dir.path(), move |r| {
                r.executor.kind = Some("http".into());
                r.executor.url = Some(url);
                r.executor.ca_file = Some(ca);
            })
        };
        let e = with_ca("http://127.0.0.1:9/orders?token=s3cret").expect_err("accepted");
        assert_eq!(e.key, "executor.ca_file", "{e}");
        assert!(e.message.contains("https://"), "{e}");
        assert!(e.file.ends_with("config.toml"), "{e}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        assert!(with_ca("https://127.0.0.1:9/orders").is_ok());
    }

    /// The start-up log says which executor fills orders: the embedded defaults' paper one
    /// says it simulates them; an HTTP one names where orders go, and no secret of its URL.
    #[test]
    fn the_executor_is_described_without_its_secrets() {
        let paper = Config::embedded(state().path()).unwrap();
        let said = paper.executor.describe();
        assert!(
            said.starts_with("paper") && said.contains("simulated"),
            "{said}"
        );
        let http = checked(|r| {
            r.executor.kind = Some("http".into());
            r.executor.url = Some("https://exec.example:9443/o/s3cret?token=s3cret".into());
        })
        .unwrap();
        let said = http.executor.describe();
        assert_eq!(said, "http: orders go to https://exec.example:9443/…");
    }

    /// A file names its executor: one with no `[executor]`, or none of its keys, ran the
    /// paper executor, its senders answered 200 for orders no venue saw.
    #[test]
    fn a_config_file_names_its_executor() {
        let e = checked(|r| r.executor = Default::default()).expect_err("accepted");
        assert_eq!(e.key, "executor.kind", "{e}");
        assert!(e.message.contains("\"paper\" only simulates"), "{e}");
        assert!(e.file.ends_with("config.toml"), "{e}");
        // Named, paper is what it says.
        let paper = checked(|r| r.executor.kind = Some("paper".into())).unwrap();
        assert_eq!(paper.executor.kind(), "paper");
    }

    /// What a config that leaves a key out gets (SPEC §1, §7): pinned, since every test
    /// config and the embedded one set most of them.
    #[test]
    fn keys_left_out_take_the_specified_defaults() {
        let c = checked(|r| {
            r.server.listen = None;
            r.server.max_connections = None;
            r.server.max_connections_per_ip = None;
            r.store.ttl = None;
            r.limits.capacity = None;
            r.executor.kind = Some("http".into());
            r.executor.url = Some("http://127.0.0.1:9/order".into());
            r.executor.timeout = None;
            r.executor.on_unknown_outcome = None;
        })
        .unwrap();
        assert_eq!(c.listen, "0.0.0.0:8443".parse().unwrap());
        assert_eq!((c.max_connections, c.max_connections_per_ip), (1024, 256));
        assert_eq!(c.ttl, Duration::from_secs(300));
        assert_eq!(c.capacity, 1_000_000);
        assert_eq!(c.on_unknown_outcome, OnUnknown::Hold);
        match c.executor {
            ExecutorKind::Http(h) => assert_eq!(h.timeout, Duration::from_secs(10)),
            _ => panic!("not the http executor"),
        }
    }

    /// A relative admin socket is in the config file's folder, as every relative path in
    /// it is, not in whatever folder the gateway (or an operator's CLI) started in.
    #[test]
    fn a_relative_admin_socket_is_beside_the_config() {
        let dir = state();
        let config = checked_in(dir.path(), |r| {
            r.admin = Some(RawAdmin {
                listen: Some("unix:run/admin.sock".into()),
            })
        })
        .unwrap();
        let want = dir.path().join("run/admin.sock");
        assert_eq!(config.admin, Some(Listen::Unix(want)));
    }

    /// A bad certificate, key or client CA is a config error naming that key, so the
    /// operator opens the right file.
    #[test]
    fn tls_errors_name_the_file_at_fault() {
        let dir = state();
        let blamed = |edit: fn(&mut RawFile)| checked_in(dir.path(), edit).err().map(|e| e.key);
        // The secret is a file of the right mode with no PEM in it.
        fn not_pem() -> Option<PathBuf> {
            Some(PathBuf::from("secrets/secret"))
        }
        assert_eq!(
            blamed(|r| r.server.key = not_pem()).as_deref(),
            Some("server.key")
        );
        assert_eq!(
            blamed(|r| r.server.cert = not_pem()).as_deref(),
            Some("server.cert")
        );
        assert_eq!(
            blamed(|r| r.server.client_ca = not_pem()).as_deref(),
            Some("server.client_ca")
        );
        assert!(blamed(|_| {}).is_none());
        // One path for two of them: the one whose file it is not is named.
        assert_eq!(
            blamed(|r| r.server.cert = r.server.key.clone()).as_deref(),
            Some("server.cert")
        );
        assert_eq!(
            blamed(|r| r.server.client_ca = r.server.key.clone()).as_deref(),
            Some("server.client_ca")
        );
        // A key anyone may read.
        let key = dir.path().join("tls/key.pem");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        assert_eq!(blamed(|_| {}).as_deref(), Some("server.key"));
        // Said of the key as it is, not as a secrets file.
        let e = checked_in(dir.path(), |_| {}).expect_err("accepted");
        let m = e.message;
        assert!(
            m.contains("key.pem holds a secret and is readable by everyone"),
            "{m}"
        );
    }

    /// A secrets file that cannot be read is a config error in the config file that names
    /// it, under its key, with the secrets file's path in the message.
    #[test]
    fn a_missing_secrets_file_is_named_with_the_config_file_and_key() {
        let dir = state();
        let e = checked_in(dir.path(), |r| {
            r.auth.bearer_tokens_file = Some(PathBuf::from("secrets/nope"));
        })
        .expect_err("accepted");
        assert_eq!(e.key, "auth.bearer_tokens_file", "{e}");
        assert_eq!(Path::new(&e.file), dir.path().join("config.toml"), "{e}");
        let nope = dir.path().join("secrets/nope");
        assert!(e.message.contains(&nope.display().to_string()), "{e}");
    }

    /// A TOML error says which line, and never quotes it: it may hold a secret.
    #[test]
    fn syntax_errors_name_the_line_not_its_text() {
        let text =
            "[server]\nlisten = \"127.0.0.1:8443\"\n\n[executor]\nurl = \"http://u:s3cret@h/x\n";
        let e = toml::from_str::<RawFile>(text)
            .err()
            .expect("unterminated string");
        let (key, m) = syntax(text, &e);
        assert!(m.starts_with("line 5: "), "{m}");
        assert!(!m.contains("s3cret") && !m.contains('\n'), "{m}");
        assert_eq!(key, "executor.url");
    }

    /// A key toml refuses (unknown, or of the wrong type) is named with its table, on its
    /// own line: an error at the start of a line is on that line, not the one before.
    #[test]
    fn a_refused_key_is_named_with_its_table_and_line() {
        let cases = [
            (
                "[server]\nlisen = \"x\"\n",
                "server.lisen",
                "line 2: ",
                "unknown",
            ),
            (
                "[server]\nlisten = \"127.0.0.1:1\"\n\n# cap\nmax_connections = \"100\"\n",
                "server.max_connections",
                "line 5: ",
                "invalid type: string \"100\", expected a whole number from 0 to 1844674407",
            ),
            // A number given as text says what to write, not the Rust type it is read as.
            (
                "[limits]\nrate_per_s = \"5\"\n",
                "limits.rate_per_s",
                "line 2: ",
                "invalid type: string \"5\", expected a number",
            ),
            // A whole number out of its range says the range, not only "a whole number".
            (
                "[limits]\nburst = 5000000000\n",
                "limits.burst",
                "line 2: ",
                "invalid value: integer `5000000000`, expected a whole number from 0 to \
                 4294967295",
            ),
            ("ttl = \"1s\"\n", "ttl", "line 1: ", "unknown"),
            // A comment after a header, as in README's example config.
            (
                "[store]   # state\nttl = 300\n",
                "store.ttl",
                "line 2: ",
                "invalid type",
            ),
            ("[sever] # typo\nx = 1\n", "sever", "line 1: ", "unknown"),
            (
                "[store]\nttl = \"1s\"\n[sever]\nx = 1\n",
                "sever",
                "line 3: ",
                "unknown",
            ),
            // An error inside a multi-line string names no key: the line is the value's.
            (
                "[executor]\nurl = \"\"\"https://bot:\\\ns3cret=@exec.example/x\\q\"\"\"\n",
                "(syntax)",
                "line 3: ",
                "",
            ),
            // A secrets file given as the config: what stands before its `=` is a secret,
            // not a key, and is not said.
            ("s3cretBASE64pad==\n", "(syntax)", "line 1: ", ""),
            ("# hmac\nS3CRETpad=\n", "(syntax)", "line 2: ", ""),
            // A key's value missing: named.
            ("[store]\nttl = \n", "store.ttl", "line 2: ", ""),
            // Shaped as a key, small letters only: nothing but padding after its `=`.
            ("onlylowercasesecret==\n", "(syntax)", "line 1: ", ""),
            ("[auth]\nonly_lower.case=\n", "(syntax)", "line 2: ", ""),
            // One whose value reads as TOML: the unknown field toml names is the secret.
            (
                "s3cret=1\n",
                "(syntax)",
                "line 1: ",
                "unknown field, expected one of",
            ),
            (
                "[auth]\ns3cret=true\n",
                "(syntax)",
                "line 2: ",
                "unknown field, expected",
            ),
        ];
        for (text, want_key, want_line, says) in cases {
            let e = toml::from_str::<RawFile>(text).err().expect(want_key);
            let (key, m) = syntax(text, &e);
            assert_eq!(key, want_key, "{m}");
            assert!(m.starts_with(want_line) && m.contains(says), "{m}");
            for secret in ["s3cret", "only"] {
                assert!(!m.contains(secret) && !key.contains(secret), "{key}: {m}");
            }
        }
    }

    /// Each range is inclusive at both ends, and a value just outside is refused naming its
    /// key. The ends are what an operator copies from the error message.
    #[test]
    fn ranges_hold_their_ends_and_refuse_just_beyond() {
        fn s(v: &str) -> Option<String> {
            Some(v.to_string())
        }
        let expect = |key: &str, ok: bool, edit: fn(&mut RawFile)| match checked(edit) {
            Ok(_) => assert!(ok, "{key} accepted"),
            Err(e) => {
                assert!(!ok, "{key} refused: {e}");
                assert_eq!(e.key, key, "{e}");
            }
        };
        let (hs, head) = ("server.handshake_timeout", "server.header_timeout");
        expect(hs, true, |r| r.server.handshake_timeout = s("100ms"));
        expect(hs, false, |r| r.server.handshake_timeout = s("99ms"));
        expect(head, true, |r| r.server.header_timeout = s("1h"));
        expect(head, false, |r| r.server.header_timeout = s("3601s"));
        expect("store.ttl", true, |r| r.store.ttl = s("1s"));
        expect("store.ttl", false, |r| r.store.ttl = s("999ms"));
        expect("store.ttl", true, |r| r.store.ttl = s("24h"));
        expect("store.ttl", false, |r| r.store.ttl = s("86401s"));
        let (max, per_ip) = ("server.max_connections", "server.max_connections_per_ip");
        expect(max, true, |r| r.server.max_connections = Some(1));
        expect(max, false, |r| r.server.max_connections = Some(0));
        expect(max, true, |r| {
            r.server.max_connections = Some(MAX_CONNECTIONS)
        });
        expect(max, false, |r| {
            r.server.max_connections = Some(MAX_CONNECTIONS + 1)
        });
        expect(per_ip, true, |r| r.server.max_connections_per_ip = Some(1));
        expect(per_ip, false, |r| r.server.max_connections_per_ip = Some(0));
        // An allowlist of one address lets one in; an empty one is refused, not "all".
        let ips = "limits.allow_ips";
        expect(ips, true, |r| {
            r.limits.allow_ips = Some(vec!["10.1.1.1".into()])
        });
        expect(ips, false, |r| r.limits.allow_ips = Some(vec![]));
        expect("limits.capacity", true, |r| r.limits.capacity = Some(2));
        expect("limits.capacity", false, |r| r.limits.capacity = Some(1));
        expect("limits.capacity", false, |r| r.limits.capacity = Some(0));
        let rate = "limits.rate_per_s";
        expect(rate, true, |r| r.limits.rate_per_s = Some(0.001));
        expect(rate, true, |r| r.limits.rate_per_s = Some(1.0 / 3600.0));
        expect(rate, false, |r| r.limits.rate_per_s = Some(0.999 / 3600.0));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = checked(|r| r.limits.rate_per_s = Some(bad)).err();
            assert_eq!(e.map(|e| e.key).as_deref(), Some(rate), "{bad}");
        }
    }

    /// A key must outlive its order, which may start up to the mutex's deadline (2 s) after
    /// the key's TTL began: a TTL equal to the executor's timeout and that deadline is
    /// refused, one a millisecond longer is not.
    #[test]
    fn the_ttl_must_be_longer_than_the_executor_timeout() {
        let http = |ttl, timeout| http_executor(timeout, Some(ttl));
        let Err(e) = http("12s", "10s") else {
            panic!("a TTL equal to the timeout and the deadline was accepted")
        };
        assert_eq!(e.key, "store.ttl", "{e}");
        assert!(e.message.contains("executor.timeout (10s)"), "{e}");
        assert!(e.message.contains("store.timeout (2s)"), "{e}");
        assert!(http("12s", "9999ms").is_ok());
        // A longer store.timeout asks for a longer TTL.
        let waiting = |ttl| http_executor_waiting("10s", Some(ttl), Some("5s"));
        let e = waiting("15s").expect_err("a TTL of the timeout and store.timeout");
        assert_eq!(e.key, "store.ttl", "{e}");
        assert!(e.message.contains("store.timeout (5s)"), "{e}");
        assert!(waiting("15001ms").is_ok());
    }

    /// Each start of the embedded defaults in a new folder makes its own secret: 256 bits,
    /// never a fixed or empty one.
    #[test]
    fn embedded_secrets_are_random_and_kept() {
        let secret = |dir: &Path| std::fs::read_to_string(dir.join("secrets/secret")).unwrap();
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        Config::embedded(a.path()).unwrap();
        Config::embedded(b.path()).unwrap();
        let first = secret(a.path());
        assert_eq!(first.trim_end().len(), 64, "{first:?}");
        assert!(first.trim_end().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(first, secret(b.path()));
        // A second start keeps the secret and the certificate it made.
        let cert = std::fs::read(a.path().join("tls/cert.pem")).unwrap();
        Config::embedded(a.path()).unwrap();
        assert_eq!(secret(a.path()), first);
        assert_eq!(std::fs::read(a.path().join("tls/cert.pem")).unwrap(), cert);
        // Its key deleted, the pair is made again: the certificate alone is of no use.
        std::fs::remove_file(a.path().join("tls/key.pem")).unwrap();
        Config::embedded(a.path()).unwrap();
        assert!(a.path().join("tls/key.pem").exists());
        assert_ne!(std::fs::read(a.path().join("tls/cert.pem")).unwrap(), cert);
        // The header the first-run curl line sends carries that secret, and is made again
        // from it when it is gone (a start killed between the two writes, or deleted).
        let header = a.path().join("secrets/curl-auth.header");
        let bearer = format!("Authorization: Bearer {first}");
        assert_eq!(std::fs::read_to_string(&header).unwrap(), bearer);
        std::fs::remove_file(&header).unwrap();
        Config::embedded(a.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&header).unwrap(), bearer);
        assert_eq!(secret(a.path()), first);
        // Left readable by others (a chmod by hand), it is made private again.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        std::fs::set_permissions(&header, std::fs::Permissions::from_mode(0o644)).unwrap();
        Config::embedded(a.path()).unwrap();
        assert_eq!(mode(&header), 0o600);
        assert_eq!(std::fs::read_to_string(&header).unwrap(), bearer);
        // A secret deleted for a new one: the header follows it.
        std::fs::remove_file(a.path().join("secrets/secret")).unwrap();
        Config::embedded(a.path()).unwrap();
        let second = secret(a.path());
        assert_ne!(second, first);
        let header = std::fs::read_to_string(&header).unwrap();
        assert_eq!(header, format!("Authorization: Bearer {second}"));
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("300s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("300").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("3 days").is_err());
        let half = parse_duration("1.5s").unwrap_err();
        assert!(
            half.contains("a whole number") && half.contains("1500ms"),
            "{half}"
        );
        let unit = parse_duration("5x").unwrap_err();
        assert!(unit.contains("unit must be ms, s, m or h"), "{unit}");
        assert!(parse_duration("99999999999999999999h").is_err());
    }
}
