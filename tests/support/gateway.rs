//! The real `hoox-edge` binary, started on port 0 with a config written into a temp folder,
//! talked to over real TLS. Killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hoox_edge::admin::Listen;

use super::client::{Reply, TlsClient};
use super::executor::MockExecutor;
use super::pki::Pki;

pub const BIN: &str = env!("CARGO_BIN_EXE_hoox-edge");

/// The shared secret every test gateway accepts (api key, HMAC and bearer alike).
pub const SECRET: &str = "test-secret-0123456789abcdef";

/// A folder with certificates, secrets and a config for one gateway.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub pki: Pki,
    /// The config as a TOML table; tests change it before `start`.
    pub config: toml::Table,
}

impl Setup {
    /// A config whose executor is `executor_url` (or the paper executor when `None`).
    pub fn new(executor_url: Option<&str>) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new(dir.path(), "gw");
        let secrets = dir.path().join("secrets");
        std::fs::create_dir(&secrets).unwrap();
        for f in ["api-keys", "hmac", "bearer"] {
            write_secret(
                &secrets.join(f),
                &format!("# rotation: old and new\nold-secret-xyz\n{SECRET}\n"),
            );
        }
        std::fs::create_dir(dir.path().join("state")).unwrap();
        let executor = match executor_url {
            Some(url) => format!("kind = \"http\"\nurl = \"{url}\"\ntimeout = \"1s\"\n"),
            None => "kind = \"paper\"\n".to_string(),
        };
        let text = format!(
            r#"
[server]
listen = "127.0.0.1:0"
cert = "{cert}"
key = "{key}"
header_timeout = "1s"
handshake_timeout = "2s"

[admin]
listen = "127.0.0.1:0"

[store]
path = "state/mutex.redb"
ttl = "300s"

[auth]
api_keys_file = "secrets/api-keys"
hmac_secrets_file = "secrets/hmac"
bearer_tokens_file = "secrets/bearer"

[executor]
{executor}
"#,
            cert = pki.server.cert.display(),
            key = pki.server.key.display(),
        );
        let config: toml::Table = toml::from_str(&text).unwrap();
        Setup { dir, pki, config }
    }

    /// Sets `section.key = value` in the config.
    pub fn set(&mut self, section: &str, key: &str, value: impl Into<toml::Value>) -> &mut Self {
        let t = self
            .config
            .entry(section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t.as_table_mut().unwrap().insert(key.into(), value.into());
        self
    }

    pub fn remove(&mut self, section: &str, key: &str) -> &mut Self {
        if let Some(t) = self.config.get_mut(section).and_then(|t| t.as_table_mut()) {
            t.remove(key);
        }
        self
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }

    pub fn write_config(&self) -> PathBuf {
        let p = self.config_path();
        std::fs::write(&p, toml::to_string(&self.config).unwrap()).unwrap();
        p
    }

    /// Everything in the setup's folder made `uid`'s (its group `uid` too), the config
    /// written first: for a gateway run as another user.
    pub fn give_to(&self, uid: u32) {
        use std::os::unix::fs::chown;
        self.write_config();
        let mut dirs = vec![self.dir.path().to_path_buf()];
        while let Some(d) = dirs.pop() {
            chown(&d, Some(uid), Some(uid)).unwrap();
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                if e.file_type().unwrap().is_dir() {
                    dirs.push(e.path());
                } else {
                    chown(e.path(), Some(uid), Some(uid)).unwrap();
                }
            }
        }
    }

    /// Starts the binary and waits until it listens (not until the database is open: see
    /// [`Gateway::wait_ready`]).
    pub fn start(&self) -> Gateway {
        self.start_with(&[])
    }

    pub fn start_with(&self, env: &[(&str, &str)]) -> Gateway {
        let mut cmd = self.command();
        for (k, v) in env {
            cmd.env(k, v);
        }
        Gateway::spawn(cmd, &self.pki.ca_cert)
    }

    /// The command that starts this gateway, for tests that change how it runs.
    pub fn command(&self) -> Command {
        let config = self.write_config();
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            // The tests' own runs set these where they mean to: one in the shell that
            // runs the tests must not change what the gateway logs or how it runs.
            .env_remove("HOOX_EDGE_LOG")
            .env_remove("TOKIO_WORKER_THREADS");
        cmd
    }

    pub fn client(&self) -> TlsClient {
        TlsClient::new(&self.pki.ca_cert)
    }
}

/// Whether `/readyz` on the admin listener `admin` answers `want` (200 or 503) within 20 s.
pub async fn readyz_is(admin: &Listen, want: u16) -> bool {
    readyz_is_within(admin, want, Duration::from_secs(20)).await
}

/// Whether `/readyz` answers `want` within `within`.
pub async fn readyz_is_within(admin: &Listen, want: u16, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if let Ok((s, _)) = hoox_edge::admin::client::request(admin, "GET", "/readyz").await
            && s == want
        {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn write_secret(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A running gateway process.
pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    /// `None` for a config without `[admin]` (the gateway printed "admin off").
    pub admin: Option<Listen>,
    pub client: TlsClient,
    /// Everything it wrote to stderr so far, collected by a thread.
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Gateway {
    pub fn spawn(cmd: Command, ca: &Path) -> Gateway {
        Self::spawn_with_stdout(cmd, ca).0
    }

    /// As [`Gateway::spawn`], and the lines the gateway writes to stdout after its first
    /// (the embedded defaults' `try it:` and curl lines), as they come.
    pub fn spawn_with_stdout(mut cmd: Command, ca: &Path) -> (Gateway, mpsc::Receiver<String>) {
        let mut child = cmd.spawn().expect("start hoox-edge");
        let stdout = child.stdout.take().unwrap();
        let log = Self::collect_stderr(&mut child);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    // "hoox-edge: gateway on https://ADDR admin ADDR"
                    if let Some(rest) = line.strip_prefix("hoox-edge: gateway on https://") {
                        let mut it = rest.split(" admin ");
                        let addr = it.next().unwrap().parse().unwrap();
                        let admin = match it.next().unwrap() {
                            "off" => None,
                            listen => Some(Listen::parse(listen).unwrap()),
                        };
                        let gw = Gateway {
                            child,
                            addr,
                            admin,
                            client: TlsClient::new(ca),
                            stderr: log,
                        };
                        return (gw, rx);
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let status = child.wait().unwrap();
                    panic!(
                        "hoox-edge did not start ({status}); stderr:\n{}",
                        log.lock().unwrap()
                    );
                }
            }
        }
    }

    /// As [`Gateway::spawn`], for a gateway whose stdout is not for the test to read (a
    /// file, /dev/full): its address is read from its log's "listening on" line, and its
    /// admin listener is the one its config gives, `admin`.
    pub fn spawn_reading_the_log(mut cmd: Command, ca: &Path, admin: Listen) -> Gateway {
        let mut child = cmd.spawn().expect("start hoox-edge");
        let log = Self::collect_stderr(&mut child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = loop {
            let said = log.lock().unwrap().clone();
            let listening = said
                .lines()
                .find_map(|l| l.split("listening on https://").nth(1));
            if let Some(addr) = listening {
                break addr.trim().parse().unwrap();
            }
            if Instant::now() >= deadline || child.try_wait().unwrap().is_some() {
                let _ = child.kill();
                let status = child.wait().unwrap();
                panic!("hoox-edge did not start ({status}); stderr:\n{said}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Gateway {
            child,
            addr,
            admin: Some(admin),
            client: TlsClient::new(ca),
            stderr: log,
        }
    }

    /// Collects what `child` writes to stderr, line by line, on a thread of its own.
    fn collect_stderr(child: &mut Child) -> std::sync::Arc<std::sync::Mutex<String>> {
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                log2.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        log
    }

    pub fn url(&self) -> String {
        format!("https://localhost:{}/webhook", self.addr.port())
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Its stderr once it holds `what` (20 s at most): lines reach it from a reading thread.
    pub fn wait_logged(&self, what: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let log = self.stderr();
            if log.contains(what) {
                return log;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what:?} never logged:\n{log}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    pub fn admin_listen(&self) -> &Listen {
        self.admin
            .as_ref()
            .expect("a gateway started without [admin]")
    }

    /// An admin request: (status, body as JSON or string).
    pub async fn admin(&self, method: &str, path: &str) -> (u16, serde_json::Value) {
        let (status, body) = hoox_edge::admin::client::request(self.admin_listen(), method, path)
            .await
            .expect("admin request");
        let v = serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body));
        (status, v)
    }

    /// Waits until `/readyz` answers `want` (200 or 503), for at most 20 s.
    pub async fn wait_ready_is(&self, want: u16) {
        assert!(
            readyz_is(self.admin_listen(), want).await,
            "/readyz never answered {want}; stderr:\n{}",
            self.stderr()
        );
    }

    /// Waits until `/readyz` is 503 for `reason` (e.g. "halted", "not_open"), for at most 20 s.
    pub async fn wait_unready_because(&self, reason: &str) {
        self.wait_unready_until(reason, |body| body["reason"] == reason)
            .await
    }

    /// Waits (20 s at most) until `/readyz` is 503 with a body that `ok` accepts (`what`
    /// names it if it never comes): the owner publishes why it fails closed a little after
    /// it logs it, and an earlier reason (the open in progress) may show meanwhile.
    pub async fn wait_unready_until(&self, what: &str, ok: impl Fn(&serde_json::Value) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (s, body) = self.admin("GET", "/readyz").await;
            if s == 503 && ok(&body) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "/readyz never said {what}: {s} {body}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wait_ready(&self) {
        self.wait_ready_is(200).await
    }

    /// POSTs a webhook with extra headers.
    pub async fn post(&self, body: &serde_json::Value, headers: &[(&str, &str)]) -> Reply {
        self.client
            .request(hyper::Method::POST, &self.url(), headers, body.to_string())
            .await
    }

    /// SIGTERM, then wait for the exit status (bounded).
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "hoox-edge did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and how the process ended: by the signal, unless it had ended already.
    pub fn kill9(&mut self) -> std::process::ExitStatus {
        let _ = self.child.kill();
        self.child.wait().expect("the gateway's exit status")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The usual rig: a mock executor, a gateway configured for it, started and ready.
pub async fn with_mock() -> (MockExecutor, Setup, Gateway) {
    with_mock_configured(|_| {}).await
}

/// As [`with_mock`], with the config changed by `configure` before the start.
pub async fn with_mock_configured(
    configure: impl FnOnce(&mut Setup),
) -> (MockExecutor, Setup, Gateway) {
    let exec = MockExecutor::start().await;
    let mut setup = Setup::new(Some(&exec.url()));
    configure(&mut setup);
    let gw = setup.start();
    gw.wait_ready().await;
    (exec, setup, gw)
}

/// A valid HOOX trade, authenticated by body api key.
pub fn trade(symbol: &str) -> serde_json::Value {
    serde_json::json!({
        "exchange": "binance",
        "symbol": symbol,
        "action": "long",
        "quantity": 1.5,
        "apiKey": SECRET,
    })
}
