//! `run(config, shutdown)`: wires the mutex, the executor, the gateway and the admin face,
//! and speaks to systemd. Tests drive it (or the binary) on port 0.
//!
//! Start order matters for the appliance: listen for SIGTERM, SIGINT and SIGHUP first (a
//! signal's default action would end the process, and systemd counts an end by SIGHUP or
//! SIGTERM as clean: no restart), check what can be refused and bind the listeners (so a
//! bad file or a port clash is an error at start that never touched the database), then
//! start the owner, and report READY=1 only once the database is open too. Stop order is the
//! reverse: stop accepting, let in-flight requests commit or release, then close the
//! database cleanly.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::admin;
use crate::config::{Config, ExecutorKind, Reload};
use crate::executor::{self, Executor, Outstanding};
use crate::gateway::auth::{Authenticator, Method};
use crate::gateway::limits::RateLimiter;
use crate::gateway::{self, ConnLimits, Gateway, Reloadable, TlsConfig};
use crate::metrics::Metrics;
use crate::mutex::{self, Clock, Closed, Mutex, Unavailable};
use crate::platform::notify;

/// Set to `1` to let `POST /debug/stall` on the admin listener stall the owner loop. For
/// the fault tests only: it is how a wedged disk is simulated.
pub const STALL_HOOK_ENV: &str = "HOOX_EDGE_TEST_STALL_HOOK";

fn stall_hook() -> bool {
    std::env::var(STALL_HOOK_ENV).is_ok_and(|v| v == "1")
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Named as a config error is, by file and key (or by the flag that set the address):
    /// the address is the operator's.
    #[error("{at}: cannot listen on {addr}: {source}")]
    Bind {
        at: String,
        addr: String,
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(#[from] crate::gateway::tls::TlsError),
    #[error("executor: {0}")]
    Executor(String),
    #[error("authentication: {0}")]
    Auth(String),
    /// The OS would not make the mutex's owner thread (a limit on processes and threads).
    #[error("{no}: {0}", no = crate::platform::NO_THREAD)]
    Thread(std::io::Error),
    /// It served and stopped, but the database did not close cleanly (`Closed::Failed`).
    #[error("the database was not closed cleanly: {0}")]
    NotClosed(String),
}

/// A gateway whose listeners are bound and whose owner thread runs.
pub struct Started {
    pub gateway_addr: SocketAddr,
    /// `host:port`, or `unix:/path`.
    pub admin_addr: Option<String>,
    config: Config,
    mutex: Mutex,
    owner: mutex::Owner,
    listener: tokio::net::TcpListener,
    admin: Option<admin::Bound>,
    tls: TlsConfig,
    gw: Arc<Gateway>,
    metrics: Arc<Metrics>,
    /// Registered at start: from then on a SIGHUP reloads instead of ending the process.
    hangup: std::io::Result<Signal>,
    /// Registered at start, as SIGHUP is.
    terminate: Terminate,
}

/// SIGTERM and SIGINT, listened for from the moment it is made: one that arrives before
/// anyone waits for it is kept, not lost, nor left to its default action. SIGUSR1 and
/// SIGUSR2 too, which by default end the process (orders in flight lost their answers and
/// commits): a daemon's "reopen your logs" by habit is said and not acted on.
struct Terminate(Option<Signals>);

struct Signals {
    term: Signal,
    int: Signal,
    /// `None` where it could not be listened for: left to its default action.
    user: [Option<Signal>; 2],
}

impl Terminate {
    fn listen() -> Terminate {
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Terminate(Some(Signals {
                term,
                int,
                user: [
                    signal(SignalKind::user_defined1()).ok(),
                    signal(SignalKind::user_defined2()).ok(),
                ],
            })),
            _ => {
                log::warn!("cannot listen for SIGTERM and SIGINT: only SIGKILL stops this");
                Terminate(None)
            }
        }
    }

    /// Resolves on SIGTERM or SIGINT; never, without the handlers. Those that come after
    /// it, while the gateway drains, are said (a second Ctrl-C left no trace, and the
    /// stop seemed hung), and not acted on: the drain is what keeps each order's commit.
    async fn recv(self) {
        let Some(mut s) = self.0 else {
            return std::future::pending::<()>().await;
        };
        let user = async |s: &mut [Option<Signal>; 2]| {
            let [one, two] = s;
            let got = async |sig: &mut Option<Signal>| match sig {
                Some(sig) => sig.recv().await,
                None => std::future::pending().await,
            };
            tokio::select! {
                _ = got(one) => "SIGUSR1",
                _ = got(two) => "SIGUSR2",
            }
        };
        loop {
            tokio::select! {
                _ = s.term.recv() => break,
                _ = s.int.recv() => break,
                name = user(&mut s.user) => {
                    log::info!("{name}: not acted on (SIGHUP reloads, SIGTERM stops)");
                }
            }
        }
        tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    _ = s.term.recv() => "SIGTERM",
                    _ = s.int.recv() => "SIGINT",
                    name = user(&mut s.user) => name,
                };
                log::warn!(
                    "{name} while stopping: not acted on; the stop drains in-flight requests \
                     (within {:?}) and then closes the database (SIGKILL ends it now: orders \
                     in flight then stay held, their outcome unknown, and the next start \
                     replays the journal)",
                    gateway::DRAIN
                );
            }
        });
    }
}

/// A write past RLIMIT_FSIZE (`LimitFSIZE=`, a shell's `ulimit -f`) raises SIGXFSZ, whose
/// default action kills the process: mid-checkpoint, then again at each restart's replay,
/// until systemd stops restarting it, and it stays down after the limit is lifted. Ignored,
/// the write fails with EFBIG instead, which the mutex answers by failing closed, and it
/// resumes by itself once the limit is lifted (docs/DESIGN.md, "Failure rules").
pub fn ignore_file_size_signal() {
    // SAFETY: installs no handler, only the disposition SIG_IGN, which is valid for this
    // signal at any time; nothing else in the process handles SIGXFSZ.
    if unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) } == libc::SIG_ERR {
        log::warn!("cannot ignore SIGXFSZ: a file-size limit would kill the process");
    }
}

/// Said by `serve` and by `check-config` of a config without `[admin]`: allowed (an
/// operator may want no admin face at all), but never by accident.
pub const NO_ADMIN: &str =
    "no [admin] listen in the config: no /readyz, /metrics, key release or kill switch";

/// Said by `serve` and by `check-config` of a config with `on_unknown_outcome = "release"`:
/// allowed, and documented, but it gives up the one guarantee the gateway is for on exactly
/// the orders whose fate nobody knows.
pub const RELEASE_ON_UNKNOWN: &str = "executor.on_unknown_outcome = \"release\": an order \
     whose outcome is unknown (504) is released, and a retry of it may be placed twice";

/// Binds everything and starts the owner. Errors here are start-up errors, and come before
/// the owner starts: a failed start leaves the database as it was.
pub async fn start(config: Config) -> Result<Started, RunError> {
    let hangup = signal(SignalKind::hangup());
    let terminate = Terminate::listen();
    ignore_file_size_signal();
    let tls_cfg = config.tls.load()?;
    if config.on_unknown_outcome == crate::config::OnUnknown::Release {
        log::warn!("{RELEASE_ON_UNKNOWN}");
    }
    let executor = match &config.executor {
        ExecutorKind::Paper => Executor::Paper(executor::paper::Paper::new()),
        ExecutorKind::Http(cfg) => Executor::Http(
            executor::http::HttpExecutor::new(cfg.clone())
                .map_err(|e| RunError::Executor(e.to_string()))?,
        ),
    };
    let authenticator = authenticator(&config)?;
    let allowlist = config.allow_ips.clone();
    let (listener, gateway_addr) =
        gateway::bind(config.listen)
            .await
            .map_err(|source| RunError::Bind {
                at: config.origin("server.listen"),
                addr: config.listen.to_string(),
                source,
            })?;
    let (admin, admin_addr) = match &config.admin {
        None => {
            log::warn!("{NO_ADMIN}");
            (None, None)
        }
        Some(l) => {
            let b = admin::bind(l).await.map_err(|source| RunError::Bind {
                at: config.origin("admin.listen"),
                addr: l.to_string(),
                source,
            })?;
            // A port-0 TCP listener reports its real port; a Unix socket its path.
            let a = b.listen().map(|l| l.to_string());
            (Some(b), a)
        }
    };
    let (mutex, owner) = mutex::try_start_with(
        mutex::Config {
            path: config.store_path.clone(),
            capacity: config.capacity,
            deadline: config.store_timeout,
            ..mutex::Config::default()
        },
        Clock::system(),
        stall_hook(),
    )
    .map_err(RunError::Thread)?;
    let metrics = Arc::new(Metrics::new());
    served(&tls_cfg, &config, &metrics);
    let order_slots = executor
        .may_wait()
        .then(|| Arc::new(tokio::sync::Semaphore::new(config.max_connections)));
    let gw = Arc::new(Gateway {
        mutex: mutex.clone(),
        executor,
        auth: Reloadable::new(Arc::new(authenticator)),
        limiter: config.rate_per_s.map(|r| RateLimiter::new(r, config.burst)),
        guard_limiter: config.rate_per_s.map(|r| RateLimiter::new(r, config.burst)),
        allowlist,
        metrics: metrics.clone(),
        ttl: config.ttl,
        duplicate_response: config.duplicate_response,
        on_unknown: config.on_unknown_outcome,
        require_client_key: config.require_client_key,
        body_timeout: config.header_timeout,
        in_flight: tokio_util::task::TaskTracker::new(),
        outstanding: Arc::new(Outstanding::for_deadline(mutex.deadline())),
        order_slots,
        order_time: mutex.deadline()
            + match &config.executor {
                ExecutorKind::Paper => Duration::ZERO,
                ExecutorKind::Http(cfg) => cfg.timeout,
            },
        drain_end: std::sync::OnceLock::new(),
    });
    Ok(Started {
        gateway_addr,
        admin_addr,
        config,
        mutex,
        owner,
        listener,
        admin,
        tls: Arc::new(Reloadable::new(tls_cfg)),
        gw,
        metrics,
        hangup,
        terminate,
    })
}

fn authenticator(config: &Config) -> Result<Authenticator, RunError> {
    config
        .auth
        .authenticator()
        .map_err(|e| RunError::Auth(e.to_string()))
}

/// Starts and serves until `shutdown` resolves.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    match start(config).await?.serve(shutdown).await {
        Closed::Failed(why) => Err(RunError::NotClosed(why)),
        Closed::Clean | Closed::NotOpen => Ok(()),
    }
}

impl Started {
    /// Serves until SIGTERM or SIGINT (listened for since [`start`]), then drains and
    /// closes the database.
    pub async fn serve_until_terminated(self) -> Closed {
        self.serve(std::future::pending()).await
    }

    /// Serves until `shutdown` resolves, or SIGTERM or SIGINT comes (`start` took them
    /// over from their default action, so it must act on them), then drains and closes the
    /// database, and says how it left it.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Closed {
        let Started {
            gateway_addr,
            admin_addr,
            config,
            mutex,
            owner,
            listener,
            admin,
            tls,
            gw,
            metrics,
            hangup,
            terminate,
            ..
        } = self;
        let shutdown = async {
            tokio::select! {
                _ = shutdown => {}
                _ = terminate.recv() => {}
            }
        };
        let ready = Arc::new(AtomicBool::new(false));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };

        let stopping = Arc::new(AtomicBool::new(false));
        let restart_pending = Arc::<std::sync::Mutex<Vec<String>>>::default();
        let reload_refused = Arc::<std::sync::Mutex<Option<String>>>::default();
        let admin_task = admin.map(|b| {
            let state = admin::State {
                mutex: mutex.clone(),
                metrics: metrics.clone(),
                ready: ready.clone(),
                stopping: stopping.clone(),
                stall_hook: stall_hook(),
                outstanding: gw.outstanding.clone(),
                restart_pending: restart_pending.clone(),
                reload_refused: reload_refused.clone(),
                executor: config.executor.kind(),
            };
            tokio::spawn(admin::serve(b, state, stopped()))
        });
        let announce = Announce {
            ready: ready.clone(),
            stopping,
            told: Arc::default(),
            restart_pending,
            reload_refused,
        };
        let supervisor = tokio::spawn(supervise(mutex.clone(), announce.clone(), stopped()));
        tokio::spawn(say_stranded(
            mutex.clone(),
            ready.clone(),
            gw.clone(),
            config_file(&config),
            stopped(),
        ));
        let reloader = tokio::spawn(reload_on_hangup(
            hangup,
            announce.clone(),
            config.clone(),
            admin_addr,
            tls.clone(),
            gw.clone(),
        ));

        log::info!("listening on https://{gateway_addr}");
        // Without it, nothing in the journal tells simulated fills from real orders. A
        // warning for paper: senders get 200s for orders no venue sees, which a gateway
        // meant to trade (its config replaced by the package's at an upgrade) must not hide.
        let level = match config.executor {
            ExecutorKind::Paper => log::Level::Warn,
            ExecutorKind::Http(_) => log::Level::Info,
        };
        log::log!(level, "executor: {}", config.executor.describe());
        let limits = ConnLimits {
            max_connections: config.max_connections,
            max_connections_per_ip: config.max_connections_per_ip,
            handshake_timeout: config.handshake_timeout,
            header_timeout: config.header_timeout,
        };
        gateway::serve(listener, tls, gw, limits, async {
            shutdown.await;
            announce.stopping();
            log::info!("stopping: draining in-flight requests");
        })
        .await;

        ready.store(false, Ordering::Relaxed);
        gateway::webhook::summarise_refusals(true);
        let _ = stop_tx.send(true);
        reloader.abort();
        let _ = supervisor.await;
        if let Some(t) = admin_task {
            let _ = t.await;
        }
        // The owner flushes and closes the database; it blocks, so keep it off the runtime.
        // Failing closed, it holds none to close (a folder not there, a broken file).
        let mut stop = tokio::task::spawn_blocking(move || owner.stop());
        let stop = match tokio::time::timeout(Duration::from_secs(1), &mut stop).await {
            Ok(stopped) => stopped,
            // A stalled disk: say what the stop waits for, rather than nothing for as long.
            Err(_) => {
                log::info!("stopping: waiting for the mutex's owner to close the database");
                stop.await
            }
        };
        let closed = stop.unwrap_or_else(|e| Closed::Failed(format!("its stop did not end: {e}")));
        match &closed {
            Closed::Clean => log::info!("stopped; database closed"),
            Closed::NotOpen => log::info!("stopped; the database was not open"),
            Closed::Failed(why) => log::error!(
                "stopped; the database was NOT closed cleanly ({why}): nothing synced is \
                 lost, the next start replays the journal into it; until a clean stop, \
                 do not go back to an older version on it (README, \"Going back to an \
                 older version\")"
            ),
        }
        closed
    }
}

/// How often `supervise` pings the owner, at most.
const PING_EVERY: Duration = Duration::from_secs(1);

/// READY=1 once the database is open; WATCHDOG=1 only while the owner answers a ping, or,
/// when a ping cannot get through a backlog (the queue full, or its deadline passed in
/// it), finished turns while it waited: busy is alive, only a stuck owner is killed;
/// STATUS= with what an operator wants to see in `systemctl status`.
///
/// Pings go every second (every half watchdog period, if that is shorter; a ping waits up
/// to the owner's deadline, `store.timeout`, and for a turn 2 s at least). So WATCHDOG=1
/// resumes within a second of the owner answering again, and systemd kills only an owner
/// that answered nothing for most of the period: about 8 s of the packaged 10. At the
/// half-period pace, a stall of 2 s that began just before a ping left 12 s between two
/// WATCHDOG=1, and got the service killed.
/// Without a watchdog too: each ping is a turn of the owner, and a turn is when it looks
/// for its files, so an idle gateway says a removed database or journal within a second
/// (`/readyz`, `status`), as the README promises, not within five.
/// A ping costs the owner a read, and at most one unsynced record: nothing, once a second.
async fn supervise(mutex: Mutex, announce: Announce, stopped: impl Future<Output = ()>) {
    let ready = &announce.ready;
    let watchdog = notify::watchdog_interval();
    let tick = watchdog.map_or(PING_EVERY, |w| w.min(PING_EVERY));
    let fast = Duration::from_millis(100);
    let started = tokio::time::Instant::now();
    // `ready` is cleared again at the stop: an owner stalled then is not a first open.
    let mut was_ready = false;
    let mut last_status = String::new();
    tokio::pin!(stopped);
    loop {
        gateway::webhook::summarise_refusals(false);
        was_ready |= ready.load(Ordering::Relaxed);
        let status = match ping(&mutex).await {
            Ok(s) => {
                // The first open: READY=1, unless a SIGTERM during it said STOPPING=1.
                if s.fail_closed.is_none()
                    && !ready.swap(true, Ordering::Relaxed)
                    && announce.ready()
                {
                    log::info!("ready: database open, {} live keys", s.live_keys);
                }
                // The owner answered in time: tell the watchdog we are alive.
                if watchdog.is_some() {
                    notify::watchdog();
                }
                let state = serving_line(&s);
                match lock(&announce.restart_pending).join(", ").as_str() {
                    "" => state,
                    keys => format!("{state}; restart pending: {keys}"),
                }
            }
            Err((u, behind)) => {
                // Behind, not stuck: a gateway is not killed for being busy.
                if behind && watchdog.is_some() {
                    notify::watchdog();
                }
                let opening = !was_ready && started.elapsed() < OPENING;
                unanswered(&u, behind, opening)
            }
        };
        // Failing closed too: the reload's refusal is no less true for it.
        let status = if lock(&announce.reload_refused).is_some() {
            format!("{status}; last reload refused (see the log)")
        } else {
            status
        };
        if let Some(said) = announce.status(status, &last_status) {
            // The count alone moving goes to systemd (STATUS=), not to the log: a line a
            // second while trades come would bury the audit trail in noise.
            if state_of(&said) != state_of(&last_status) {
                if said.contains("fail-closed") {
                    log::error!("{said}");
                } else {
                    log::info!("{said}");
                }
            }
            last_status = said;
        }
        // Poll quickly until ready, then at the watchdog's pace.
        let wait = if ready.load(Ordering::Relaxed) {
            tick
        } else {
            fast
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut stopped => return,
        }
    }
}

/// How long the first open may take before a ping it leaves unanswered is failing closed:
/// redb checks a database whole as it opens it, a second or more a gigabyte here.
const OPENING: Duration = Duration::from_secs(60);

/// `STATUS=` for an owner that answered: serving, halted, or why every new trade is
/// refused; full and halted says both, for `systemctl status` shows this line alone (a
/// full gateway halted read "fail-closed" with no word of the kill switch).
fn serving_line(s: &mutex::Status) -> String {
    let n = s.live_keys;
    match (s.refusing(), s.halted) {
        (Some(u), false) => format!("fail-closed: {u}; {n} live keys"),
        (Some(u), true) => format!("fail-closed: {u}; halted; {n} live keys"),
        (None, true) => format!("halted; {n} live keys"),
        (None, false) => format!("serving; {n} live keys"),
    }
}

/// A status line without its count of live keys, wherever it stands: what changed, when it
/// changed. (Taken off the end only, a line with `restart pending` after the count was
/// logged at every count that moved: a line a second while trades came.)
fn state_of(status: &str) -> String {
    let parts: Vec<&str> = status
        .split("; ")
        .filter(|p| !p.ends_with(" live keys"))
        .collect();
    parts.join("; ")
}

/// What the supervisor says of a ping the owner did not answer: `behind` (it took turns
/// meanwhile: busy, not stuck), still in its first open (`opening`, a ping timed out: an
/// error line each start of a large database said it failed closed), or failing closed.
fn unanswered(u: &Unavailable, behind: bool, opening: bool) -> String {
    match u {
        _ if behind => format!("behind: {u}"),
        Unavailable::Timeout if opening => "starting: opening the database".into(),
        _ => format!("fail-closed: {u}"),
    }
}

/// What systemd is told, READY=1 or STOPPING=1, one at a time (under `told`): READY=1,
/// from the first open or after a reload, never follows STOPPING=1, which would tell
/// systemd a unit that is stopping runs again.
#[derive(Clone)]
struct Announce {
    /// The first open has been announced.
    ready: Arc<AtomicBool>,
    /// STOPPING=1 has been said.
    stopping: Arc<AtomicBool>,
    told: Arc<std::sync::Mutex<()>>,
    /// The keys of `config.toml` changed since the start that only a restart applies, as
    /// the last reload found them (empty: none): said in STATUS=, which `systemctl status`
    /// shows, and by the admin face's `/status`, not only in one log line.
    restart_pending: Arc<std::sync::Mutex<Vec<String>>>,
    /// Why the last reload was refused (`None`: it applied, or none came): said in STATUS=
    /// and `/status` too. A refusal said only in the log, between a RELOADING=1 and a
    /// READY=1 just like a reload's that applied, looked like one to whoever sent SIGHUP.
    reload_refused: Arc<std::sync::Mutex<Option<String>>>,
}

impl Announce {
    /// READY=1, unless STOPPING=1 came first (a SIGTERM during the first open or a
    /// reload). Whether it was said.
    fn ready(&self) -> bool {
        let _told = lock(&self.told);
        let said = !self.stopping.load(Ordering::Acquire);
        if said {
            notify::ready();
        }
        said
    }

    /// STATUS=, if it says something other than `last`; from STOPPING=1 on, prefixed by
    /// `STOPPING` (draining: `systemctl status` says so, not "serving", until the process
    /// ends). Under `told`, so that no status without it follows STOPPING=1's own.
    fn status(&self, status: String, last: &str) -> Option<String> {
        let _told = lock(&self.told);
        let status = if self.stopping.load(Ordering::Acquire) {
            format!("{STOPPING}; {status}")
        } else {
            status
        };
        if status == last {
            return None;
        }
        notify::status(&status);
        Some(status)
    }

    /// Before a reload: `None` once STOPPING=1 has been said (no reload then: nothing new
    /// is served anyway, and RELOADING=1 would follow STOPPING=1), else whether
    /// RELOADING=1 was said, which is only once READY=1 was: before that, the READY=1 that
    /// ends a reload would tell systemd the database is open when it is not. Under `told`:
    /// a SIGTERM just before the SIGHUP said STOPPING=1 between a look at `stopping` and
    /// the RELOADING=1 that followed it.
    fn reloading(&self) -> Option<bool> {
        let _told = lock(&self.told);
        if self.stopping.load(Ordering::Acquire) {
            return None;
        }
        let announced = self.ready.load(Ordering::Relaxed);
        if announced {
            notify::reloading();
        }
        Some(announced)
    }

    fn stopping(&self) {
        let _told = lock(&self.told);
        self.stopping.store(true, Ordering::Release);
        notify::stopping();
        notify::status(STOPPING);
    }
}

/// What STATUS= begins with from SIGTERM on.
const STOPPING: &str = "stopping: draining in-flight requests";

/// A lock whose holder panicked is still a lock: each of these guards nothing, or a value
/// written whole.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A ping, and if it cannot get through a backlog, whether the owner is working through it
/// (`Err((_, true))`): it finished a turn within the ping's deadline, or the default one
/// (2 s) if longer, from the ping's start (a full queue refuses it at once, a short
/// `store.timeout` gives up on it early: a turn of a slow disk, or a checkpoint, outlasts
/// 100 ms, and a busy owner is alive). A stalled disk finishes no turn, so a stuck owner
/// reads `Err((_, false))` however deep its queue.
async fn ping(mutex: &Mutex) -> Result<mutex::Status, (Unavailable, bool)> {
    let turns = || mutex.shared().turns.load(Ordering::Relaxed);
    let before = turns();
    let until = tokio::time::Instant::now() + mutex.deadline().max(mutex::DEADLINE);
    let pinged = mutex.ping().await;
    if let Err(Unavailable::Busy | Unavailable::Timeout) = pinged {
        while turns() == before && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    pinged.map_err(|u| {
        let moved = matches!(u, Unavailable::Busy | Unavailable::Timeout) && turns() != before;
        (u, moved)
    })
}

/// Live client keys under identities no sender of this config is in (a secret's `@NAME`
/// given, changed or taken out, or `server.client_ca` turned on or off, while the gateway
/// was stopped): a retry of a trade they hold, sent now under the sender's new name,
/// meets none of them and is sent again. Said once the database has opened, as a reload
/// says such a change (`names_gone`), since a restart is the other way one lands.
async fn say_stranded(
    mutex: Mutex,
    ready: Arc<AtomicBool>,
    gw: Arc<Gateway>,
    file: String,
    stopped: impl Future<Output = ()>,
) {
    // Asked again while the owner fails closed: the first open may be followed by a
    // failure at once, and the counts are the open's, not the failure's.
    let held = async {
        loop {
            let opened = ready.load(Ordering::Relaxed);
            if opened && let Ok(held) = mutex.clients().await {
                return held;
            }
            // Until the open, as the supervisor looks; then once a second while failing
            // closed (refused at once, it wakes nothing else).
            let pause = if opened { 1_000 } else { 100 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    };
    let held = tokio::select! {
        held = held => held,
        () = stopped => return,
    };
    // The secrets as they are now: a reload during a slow first open may have changed them.
    let auth = gw.auth.current();
    let stranded: Vec<String> = held
        .iter()
        .filter(|(id, _)| !auth.gives(id))
        .map(|(id, n)| format!("{id} ({n})"))
        .collect();
    if held.is_empty() {
        log::debug!("no live client keys: none is under a client no sender is named");
    } else if stranded.is_empty() {
        log::debug!(
            "the live client keys are under {} client(s), each one a sender of this config \
             is named",
            held.len()
        );
    } else {
        log::warn!(
            "{file}: live client keys are held under {}, which no sender of this config is \
             named: a trade they hold, sent again under another name, is a new trade and \
             will be sent (until they expire, within store.ttl). Was a secret named \
             (@NAME), renamed or taken out, or server.client_ca changed, while stopped?",
            stranded.join(", ")
        );
    }
}

/// The client namespaces (`psk.NAME`, `cert.*`) `before` gave and `after` does not: a
/// client renamed or taken out, or every sender moved by `client_ca` added or taken out.
/// Their live keys keep the old name, so their retries, under the new one, no longer
/// meet them: said at the reload, while the operator is looking. `None`: none gone.
fn names_gone(before: &Authenticator, after: &Authenticator) -> Option<String> {
    let now = after.namespaces();
    let gone: Vec<String> = before
        .namespaces()
        .into_iter()
        .filter(|n| !now.contains(n))
        .collect();
    if gone.is_empty() {
        return None;
    }
    let why = match (
        before.configured(Method::Mtls),
        after.configured(Method::Mtls),
    ) {
        (false, true) => {
            " (server.client_ca now asks every sender for a certificate, whose name is its \
             client: cert.NAME; connections open without one are refused)"
        }
        (true, false) => {
            " (without server.client_ca, every sender is its shared secret's client: psk, \
             or psk.NAME; connections open with a certificate are refused)"
        }
        _ => "",
    };
    Some(format!("{}{why}", gone.join(", ")))
}

/// What the restart that applies `pending` will also do, for the keys whose change costs
/// more than a setting: said at the reload, not at a restart days later (a crash, an
/// upgrade) that no one is watching.
fn restart_would(
    running: &Config,
    admin_addr: Option<&str>,
    pending: &[String],
    capacity: Option<String>,
) -> String {
    let mut out = String::new();
    // Under a new `store.path` the restart starts with no live keys: room whatever the cap.
    let moved = pending.iter().any(|k| k == "store.path");
    if pending.iter().any(|k| k == "limits.capacity") && !moved {
        out += &capacity.unwrap_or_default();
    }
    if moved {
        out += &format!(
            "; store.path: the restart opens the database at the new path, without the \
             live keys (or a halt) held in {}: retries of their trades will be sent",
            running.store_path.display()
        );
    }
    if pending.iter().any(|k| k == "admin.listen") {
        out += &admin_stays(admin_addr, "admin.listen", " until the restart");
    }
    out
}

/// `limits.capacity` lowered in the file to where the keys live now leave no place for a
/// trade (two: its key and its guard, as the owner counts): the restart would refuse every
/// new trade until enough of them expire. Said at the reload, while the operator is
/// looking, not only by `status` after the restart. `None` while there is room.
fn capacity_at(capacity: usize, live: usize) -> Option<String> {
    mutex::full(live, capacity).then(|| {
        format!(
            "; limits.capacity: the file's {capacity} leaves no place for a new trade beside \
             the live keys ({live} now): after a restart every new trade is refused (503) \
             until enough of them expire or are released"
        )
    })
}

/// The admin face staying at `admin` while the file names another address (`key`, as the
/// warning names it; `until`, how long): the operator's commands read the file, and would
/// look where nothing listens. Nothing without an admin face.
fn admin_stays(admin: Option<&str>, key: &str, until: &str) -> String {
    admin.map_or_else(String::new, |admin| {
        format!(
            "; {key}: the admin API stays at {admin}{until}, where `hoox-edge status`, `halt` \
             and the other commands reading this file do not look (give them --admin {admin})"
        )
    })
}

/// Where `config` came from, as an error names it.
fn config_file(config: &Config) -> String {
    config.source.as_ref().map_or_else(
        || "the embedded defaults".into(),
        |p| p.display().to_string(),
    )
}

/// A certificate about to be served: its chain's end to the metrics, and a warning for
/// what makes clients refuse it, now or soon (`Tls::warnings`).
fn served(tls: &gateway::tls::Tls, config: &Config, metrics: &Metrics) {
    metrics.tls_served(tls.validity);
    for w in tls.warnings(&config.tls.cert) {
        log::warn!("{w}");
    }
}

/// What a reload applies: the certificate and the secrets as the files now are, and the
/// file read ([`Config::reload`]); or why not.
type Reloaded = (Arc<gateway::tls::Tls>, Authenticator, Reload);

/// [`reload`] on a thread of its own: it reads files, and one that blocks (a FIFO put in a
/// secret's place, a hung network mount) froze the runtime's worker with it: handshakes,
/// answers, `/readyz` and the watchdog's pings, until the read returned. Not on tokio's
/// blocking pool, which the runtime waits for at exit: a read that never returns would
/// hold the process after the database closed, until systemd killed it.
async fn reload_off_the_runtime(config: Config) -> Result<Reloaded, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("reload".into())
        .spawn(move || {
            let _ = tx.send(reload(&config));
        })
        .map_err(|e| format!("reload failed: cannot start its thread: {e}"))?;
    rx.await
        .map_err(|_| "reload failed: its thread ended without an answer".to_string())?
}

fn reload(config: &Config) -> Result<Reloaded, String> {
    let file = config
        .reload()
        .map_err(|e| format!("config reload failed: {e}"))?;
    let tls = file
        .applied
        .tls
        .load()
        .map_err(|e| format!("TLS reload failed: {e}"))?;
    let authenticator = file
        .applied
        .auth
        .authenticator()
        .map_err(|e| format!("secret reload failed: {e}"))?;
    Ok((tls, authenticator, file))
}

/// SIGHUP: reload certificates and secrets without dropping connections. A bad new file
/// keeps the old configuration and says why. RELOADING=1 and READY=1 frame the reload
/// only once the supervisor has said READY=1: before that, READY=1 would tell systemd the
/// database is open when it is not.
async fn reload_on_hangup(
    hangup: std::io::Result<Signal>,
    announce: Announce,
    config: Config,
    admin_addr: Option<String>,
    tls: TlsConfig,
    gw: Arc<Gateway>,
) {
    let Ok(mut hup) = hangup else {
        log::warn!("cannot listen for SIGHUP; reload disabled");
        return;
    };
    let mut config = config;
    // A SIGHUP that came during the last reload: one more follows it at once.
    let mut again = false;
    loop {
        if !std::mem::take(&mut again) && hup.recv().await.is_none() {
            return;
        }
        let Some(announced) = announce.reloading() else {
            log::info!("SIGHUP while stopping: not reloaded");
            continue;
        };
        // Both, or neither: a client CA and the secrets that go with it (or a certificate
        // deployed with a rotation) must not run half old, half new because one file of the
        // two was bad.
        // A SIGHUP that comes while this one's files are still being read asks for files
        // this reload may have read before they changed (a secret revoked a moment after
        // an automated reload began): it gets a reload of its own, once this one ends.
        // Dropped, the revoked secret went on placing orders, with a reload that said it
        // succeeded. Any number of them make one more: each reads the files as they are.
        let reloading = reload_off_the_runtime(config.clone());
        tokio::pin!(reloading);
        let reloaded = loop {
            tokio::select! {
                r = &mut reloading => break r,
                Some(()) = hup.recv() => {
                    if !again {
                        log::info!(
                            "SIGHUP during a reload: another reload follows it, to read the \
                             files as they are then"
                        );
                    }
                    again = true;
                }
            }
        };
        match reloaded {
            Ok((new_tls, authenticator, file)) => {
                let Reload {
                    applied: next,
                    pending,
                    overridden,
                    capacity,
                } = file;
                served(&new_tls, &next, &gw.metrics);
                tls.replace(new_tls);
                let gone = names_gone(&gw.auth.current(), &authenticator);
                let renamed = gw.auth.current().renamed(&authenticator);
                gw.auth.replace(Arc::new(authenticator));
                config = next;
                log::info!("reloaded the TLS certificate and the secrets");
                if !renamed.is_empty() {
                    let moved: Vec<_> = renamed.iter().map(|(a, b)| format!("{a} → {b}")).collect();
                    log::warn!(
                        "{}: a secret names another client after this reload ({}): the client \
                         keys its sender's trades took stay under the old name, so a retry of \
                         one of them, sent now with its key, is a new trade and will be sent",
                        config_file(&config),
                        moved.join(", "),
                    );
                }
                if let Some(gone) = gone {
                    log::warn!(
                        "{}: no sender is named {gone} after this reload: the keys taken \
                         under those names stay there, so a trade they hold, sent again \
                         under another name, is a new trade and will be sent",
                        config_file(&config),
                    );
                }
                if !overridden.is_empty() {
                    log::warn!(
                        "{}: {}: changed in the file, but the command line sets it, at a \
                         restart too: not applied{}",
                        config_file(&config),
                        overridden.join(", "),
                        admin_stays(
                            admin_addr
                                .as_deref()
                                .filter(|_| overridden.iter().any(|k| k.starts_with("admin."))),
                            "admin.listen",
                            ""
                        )
                    );
                }
                lock(&announce.restart_pending).clone_from(&pending);
                *lock(&announce.reload_refused) = None;
                if !pending.is_empty() {
                    log::warn!(
                        "{}: {}: changed since the start, which only a restart applies \
                         (systemctl restart hoox-edge): not applied{}",
                        config_file(&config),
                        pending.join(", "),
                        restart_would(
                            &config,
                            admin_addr.as_deref(),
                            &pending,
                            capacity_at(
                                capacity,
                                gw.mutex.shared().live_keys.load(Ordering::Relaxed)
                            )
                        )
                    );
                }
            }
            Err(e) => {
                log::error!("{e}; keeping the current certificate and secrets");
                *lock(&announce.reload_refused) = Some(e.to_string());
            }
        }
        // A SIGTERM that came during the reload: READY=1 must not follow its STOPPING=1.
        if announced {
            announce.ready();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log hears of a status when its state changes, not its count of live keys.
    #[test]
    fn a_status_state_is_its_line_without_the_count() {
        assert_eq!(state_of("serving; 12 live keys"), "serving");
        assert_eq!(
            state_of("serving; 13 live keys"),
            state_of("serving; 12 live keys")
        );
        assert_eq!(
            state_of("fail-closed: disk gone; halted; 3 live keys"),
            "fail-closed: disk gone; halted"
        );
        assert_eq!(state_of("behind: timeout"), "behind: timeout");
        // The count anywhere in the line: a restart pending, a reload refused after it.
        assert_eq!(
            state_of("serving; 13 live keys; restart pending: store.ttl"),
            "serving; restart pending: store.ttl"
        );
        assert_eq!(
            state_of("serving; 13 live keys; last reload refused (see the log)"),
            state_of("serving; 14 live keys; last reload refused (see the log)"),
        );
        assert_eq!(state_of(""), "");
        assert_ne!(
            state_of("halted; 3 live keys"),
            state_of("serving; 3 live keys")
        );
    }

    /// `client_ca` added or taken out by a reload moves every sender to another namespace
    /// (`psk` and `cert.*`): said as a name gone, with why; a reload that keeps both says
    /// nothing. tests/webhook.rs sees the line for `client_ca` added, end to end.
    #[test]
    fn client_certificates_turned_on_or_off_move_every_sender() {
        let auth = |mtls| {
            let secret = vec![crate::secrets::Secret::new("s3cret")];
            Authenticator::new(secret, vec![], vec![], mtls, vec![]).unwrap()
        };
        let on = names_gone(&auth(false), &auth(true)).unwrap();
        assert!(
            on.starts_with("psk (server.client_ca now asks every sender for a certificate"),
            "{on}"
        );
        let off = names_gone(&auth(true), &auth(false)).unwrap();
        assert!(
            off.starts_with("cert.* (without server.client_ca, every sender is its shared"),
            "{off}"
        );
        assert_eq!(names_gone(&auth(true), &auth(true)), None);
        assert_eq!(names_gone(&auth(false), &auth(false)), None);
    }

    /// A capacity the keys live now leave room under is not warned of; one they fill is,
    /// by the rule `reserve` refuses by (a signed trade takes two places).
    #[test]
    fn a_lowered_capacity_is_warned_of_only_where_it_would_refuse() {
        assert_eq!(capacity_at(1_000, 998), None);
        let full = capacity_at(1_000, 999).unwrap();
        assert!(
            full.starts_with("; limits.capacity: the file's 1000 leaves no place for a new trade beside the live keys (999 now)"),
            "{full}"
        );
        assert!(capacity_at(2, 0).is_none());
    }

    /// What a restart would cost is said for the keys pending, and only for them: a new
    /// `store.path` leaves the live keys behind (and so has room whatever the capacity).
    #[test]
    fn what_a_restart_would_cost_is_said_for_the_keys_pending_alone() {
        let dir = tempfile::tempdir().unwrap();
        let running = Config::embedded(dir.path()).unwrap();
        let said = |pending: &[&str]| {
            let pending: Vec<String> = pending.iter().map(|k| k.to_string()).collect();
            restart_would(&running, None, &pending, Some("; FULL".into()))
        };
        assert_eq!(said(&["store.ttl"]), "");
        assert_eq!(said(&["limits.capacity"]), "; FULL");
        let moved = said(&["store.path"]);
        assert!(
            moved.starts_with("; store.path: the restart opens the database at the new path"),
            "{moved}"
        );
        assert_eq!(said(&["limits.capacity", "store.path"]), moved);
    }

    #[test]
    fn the_status_line_says_full_and_halted_both() {
        let status = |halted, at_capacity| mutex::Status {
            live_keys: 2,
            halted,
            fail_closed: None,
            at_capacity,
        };
        assert_eq!(serving_line(&status(false, false)), "serving; 2 live keys");
        assert_eq!(serving_line(&status(true, false)), "halted; 2 live keys");
        assert_eq!(
            serving_line(&status(true, true)),
            "fail-closed: live-key capacity reached; halted; 2 live keys"
        );
        assert_eq!(
            serving_line(&status(false, true)),
            "fail-closed: live-key capacity reached; 2 live keys"
        );
    }

    /// A ping the first open leaves unanswered is a start under way, not a failure: each
    /// start of a large database (1.6 GB: two seconds of redb's check) logged an error
    /// that it failed closed. Only for a while, and only a timeout: a database that does
    /// not open says why.
    #[test]
    fn an_unanswered_ping_during_the_first_open_is_a_start() {
        let timeout = Unavailable::Timeout;
        assert_eq!(
            unanswered(&timeout, false, true),
            "starting: opening the database"
        );
        assert!(unanswered(&timeout, false, false).starts_with("fail-closed: "));
        assert!(unanswered(&timeout, true, true).starts_with("behind: "));
        let broken = Unavailable::NotOpen("journal record 3 is damaged".into());
        assert!(unanswered(&broken, false, true).starts_with("fail-closed: "));
    }

    /// A reload is framed (RELOADING=1) only once READY=1 was said, and not at all once
    /// STOPPING=1 was: the look and the word under one lock with STOPPING=1's
    /// (tests/systemd.rs sends the two signals together, which hits the race seldom).
    #[test]
    fn a_reload_is_framed_only_between_ready_and_stopping() {
        let announce = Announce {
            ready: Arc::default(),
            stopping: Arc::default(),
            told: Arc::default(),
            restart_pending: Arc::default(),
            reload_refused: Arc::default(),
        };
        assert_eq!(
            announce.reloading(),
            Some(false),
            "before READY=1: reload, unframed"
        );
        assert!(announce.ready());
        announce.ready.store(true, Ordering::Relaxed);
        assert_eq!(announce.reloading(), Some(true));
        announce.stopping();
        assert_eq!(announce.reloading(), None, "after STOPPING=1: no reload");
        assert!(!announce.ready(), "no READY=1 after STOPPING=1");
    }

    /// The watchdog's question, asked of a real owner: one whose queue is full (a backlog
    /// of reserves) is busy, alive, and one stalled (a wedged disk) is not, whatever its
    /// queue. Pings refused Busy must read alive, or systemd would kill a busy gateway.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_owner_is_alive_and_a_stalled_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let config = mutex::Config {
            path: dir.path().join("m.redb"),
            queue_depth: 2,
            ..mutex::Config::default()
        };
        let (m, owner) = mutex::start_with(config, Clock::system(), true);
        while m.ping().await.is_err() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The load runs until the pings have met a full queue a few times (or 10 s): a
        // fixed count could be over before the first ping on a busy machine.
        let stop = Arc::new(AtomicBool::new(false));
        let load: Vec<_> = (0..32)
            .map(|t| {
                let (m, stop) = (m.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("client:a:live:{t}-{i}");
                        let _ = m
                            .reserve(mutex::Reserve {
                                key: mutex::Key::from_stored(&key).unwrap(),
                                ttl: Duration::from_secs(60),
                                payload_hash: [0; 32],
                                guard: None,
                            })
                            .await;
                        i += 1;
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        let mut busy = 0;
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while busy < 3 && std::time::Instant::now() < until {
            match ping(&m).await {
                Err((Unavailable::Busy, alive)) => {
                    assert!(alive, "a busy owner read as stuck");
                    busy += 1;
                }
                Err((u, alive)) => assert!(alive, "{u}: a busy owner read as stuck"),
                Ok(_) => {}
            }
        }
        stop.store(true, Ordering::Relaxed);
        for t in load {
            t.await.unwrap();
        }
        assert!(busy > 0, "no ping met a full queue");
        // Reserves that timed out may still fill the queue of two: retry until the stall
        // is taken (it is dropped, unanswered, when the queue is full).
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while m.stall(Duration::from_secs(8)).await.is_err() {
            assert!(
                std::time::Instant::now() < until,
                "the stall was never taken"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(ping(&m).await.map(drop), Err((Unavailable::Timeout, false)));
        // Stalled with its queue full: refused at once, and stuck after a deadline's wait
        // for a turn, not held until the stall ends and then read alive (which kept
        // STATUS= from saying so for the whole stall).
        let fill: Vec<_> = (0..4)
            .map(|i| {
                let m = m.clone();
                tokio::spawn(async move {
                    let key = format!("client:a:live:fill-{i}");
                    m.reserve(mutex::Reserve {
                        key: mutex::Key::from_stored(&key).unwrap(),
                        ttl: Duration::from_secs(60),
                        payload_hash: [0; 32],
                        guard: None,
                    })
                    .await
                })
            })
            .collect();
        while m.ping().await != Err(Unavailable::Busy) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(ping(&m).await.map(drop), Err((Unavailable::Busy, false)));
        for f in fill {
            f.await.unwrap();
        }
        owner.stop();
    }

    /// A short `store.timeout` gives up on a ping early, not on the owner: a turn that
    /// outlasts 100 ms but ends within the default deadline (a slow disk's write, a
    /// checkpoint) reads alive, and only one stalled past 2 s reads stuck. Were the wait
    /// for a turn the ping's own 100 ms, a busy gateway on a slow disk would miss its
    /// WATCHDOG=1 pings and be killed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_store_timeout_still_waits_the_default_deadline_for_a_turn() {
        let dir = tempfile::tempdir().unwrap();
        let config = mutex::Config {
            path: dir.path().join("m.redb"),
            deadline: Duration::from_millis(100),
            ..mutex::Config::default()
        };
        let (m, owner) = mutex::start_with(config, Clock::system(), true);
        // Answered, and the turn that answered counted (it is counted after its replies).
        let idle = || async {
            while m.ping().await.is_err() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        idle().await;
        let _slow = m.stall(Duration::from_millis(600));
        assert_eq!(ping(&m).await.map(drop), Err((Unavailable::Timeout, true)));
        idle().await;
        let _stuck = m.stall(Duration::from_secs(4));
        let t0 = std::time::Instant::now();
        assert_eq!(ping(&m).await.map(drop), Err((Unavailable::Timeout, false)));
        assert!(t0.elapsed() >= mutex::DEADLINE, "{:?}", t0.elapsed());
        owner.stop();
    }

    /// A SIGHUP and a SIGTERM that come after `start` but before anyone serves are kept:
    /// the SIGHUP does not end the process (what a reload does is `tests/systemd.rs`'s), the
    /// SIGTERM stops the gateway cleanly. Left to their default action, either would end
    /// the process, and systemd would count it a clean stop (no restart). Run in a child
    /// process, since the signals go to the whole process.
    #[test]
    fn signals_between_start_and_serve_are_kept() {
        const ROLE: &str = "HOOX_APP_TEST_STATE";
        const NAME: &str = "app::tests::signals_between_start_and_serve_are_kept";
        if let Some(dir) = std::env::var_os(ROLE) {
            let mut config = Config::embedded(std::path::Path::new(&dir)).unwrap();
            config.listen = "127.0.0.1:0".parse().unwrap();
            config.admin = None;
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let started = start(config).await.unwrap();
                // SAFETY: raise(3) only sends a signal to this process.
                unsafe {
                    libc::raise(libc::SIGHUP);
                    libc::raise(libc::SIGTERM);
                }
                started.serve_until_terminated().await;
            });
            println!("CHILD stopped cleanly");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut child = crate::testing::rerun(NAME)
            .unwrap()
            .env(ROLE, dir.path())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A SIGTERM lost to a handler made too late would leave it serving: 20 s at most.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("CHILD stopped cleanly"),
            "{:?}: {stdout}",
            out.status
        );
    }
}
