//! The command line: `serve`, `check-config`, `gen-cert`, `sign`, and the operator commands
//! (`status`, `keys`, `halt`, `resume`) that talk to a running gateway's admin listener.
//!
//! Secrets never appear on the command line: `sign` reads the secret from a file.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::admin::{self, Listen};
use crate::config::{Config, EX_CONFIG};

/// The config file of an installed appliance.
pub const DEFAULT_CONFIG: &str = "/etc/hoox-edge/config.toml";
/// Where the admin listener is when nothing says otherwise.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9980";

/// sysexits' EX_UNAVAILABLE: the gateway is not there, or cannot answer now (503).
const EX_UNAVAILABLE: u8 = 69;
/// sysexits' EX_OSERR: the OS would not make a thread the gateway needs.
const EX_OSERR: u8 = 71;

/// The runtime's blocking pool at most: the executor's DNS lookups (one per new connection
/// to a named executor) and the database's close at a stop.
const BLOCKING_THREADS: usize = 8;

/// sysexits' EX_IOERR: the answer asked for could not be written to stdout; or `serve` stopped
/// with its database not closed cleanly.
const EX_IOERR: u8 = 74;

// Every message below goes to stderr through this `eprintln!`, not std's: std's panics when
// stderr cannot be written (a log file on a full disk or past a file-size limit), and with
// `panic = "abort"` the panic would take the place of the exit code the message went with
// (a config error's 78, which the unit does not restart on).
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Writes a line to stdout. A write that fails (a full disk, a file-size limit, a pipe
/// closed by its reader) is said on stderr (a closed pipe is not: its reader has gone) and
/// returned as exit 74: `println!` would panic, which aborts the process.
fn say(line: std::fmt::Arguments) -> Result<(), ExitCode> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(format_args!("{line}\n"))
        .and_then(|()| out.flush());
    written.map_err(|e| {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("hoox-edge: cannot write to stdout: {e}");
        }
        ExitCode::from(EX_IOERR)
    })
}

/// What clap's own exit would do, but for stdout: `--help` and `--version` that cannot be
/// written exit 74 as every other answer does (`say`), where clap drops the error and exits
/// 0. A usage error goes to stderr, whose failure is ignored as `eprintln!`'s is.
fn clap_exit(e: &clap::Error) -> ExitCode {
    use std::io::Write as _;
    let printed = e.print().and_then(|()| std::io::stdout().flush());
    match printed {
        Err(err) if !e.use_stderr() => {
            if err.kind() != std::io::ErrorKind::BrokenPipe {
                eprintln!("hoox-edge: cannot write to stdout: {err}");
            }
            ExitCode::from(EX_IOERR)
        }
        // clap's codes: 0 for help and version, 2 for a usage error.
        _ => ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2)),
    }
}

/// The log level: `debug`, `info` (unset), `warn` or `error`.
pub const LOG_ENV: &str = "HOOX_EDGE_LOG";

#[derive(Parser)]
#[command(
    name = "hoox-edge",
    version,
    about = "Idempotency gateway for trade webhooks",
    after_help = "Operator commands (keys, halt, resume, status) print the answer's JSON on \
                  stdout and exit 0; a refusal's problem JSON goes to stderr, exit 1 \
                  (not found, in flight, bad key); exit 69 when the gateway cannot be \
                  reached or cannot answer now (503: failing closed), and from status, \
                  its JSON still on stdout, while the gateway refuses new trades, failing \
                  closed or full (\"serving\": false); exit 78 on a config error; exit 74 \
                  when the answer cannot be written to stdout; exit 2 on a command line \
                  that does not parse."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the gateway. Without --config: embedded defaults on 127.0.0.1:8443, state,
    /// certificate and secret in --state-dir, paper executor.
    Serve {
        /// The config file (the package's: /etc/hoox-edge/config.toml). Without it, the
        /// embedded defaults.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where the embedded defaults keep their state, certificate and secret; a config
        /// file names its own paths.
        #[arg(long, default_value = "hoox-edge-state", conflicts_with = "config")]
        state_dir: PathBuf,
        /// Override the webhook listen address (e.g. 127.0.0.1:0).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Override the admin listener (host:port on loopback, or unix:/path).
        #[arg(long)]
        admin: Option<String>,
    },
    /// Check a config file, its certificate and its secret files; exit 78 on any error.
    CheckConfig {
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Write a self-signed certificate and key (cert.pem, key.pem) into a folder.
    GenCert {
        /// Folder to write cert.pem and key.pem into; made if it is not there.
        #[arg(long)]
        out: PathBuf,
        /// DNS name or IP address to certify; repeatable.
        #[arg(long = "name", default_values_t = crate::gateway::tls::LOOPBACK_NAMES.map(String::from))]
        names: Vec<String>,
        /// Overwrite an existing certificate.
        #[arg(long)]
        force: bool,
    },
    /// Print the HMAC headers for a body: X-Hoox-Timestamp and X-Hoox-Signature.
    Sign {
        /// File whose first secret line is the HMAC secret.
        #[arg(long)]
        secret_file: PathBuf,
        /// The body to sign; standard input when absent.
        #[arg(long)]
        body_file: Option<PathBuf>,
        /// Unix seconds; now when absent. Milliseconds (13 digits) are refused: the
        /// gateway reads seconds, and every request so signed would be a 401.
        #[arg(long, value_parser = clap::value_parser!(i64).range(0..=9_999_999_999))]
        timestamp: Option<i64>,
    },
    /// Inspect or release live keys.
    Keys {
        #[command(subcommand)]
        op: KeysOp,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Kill switch on: refuse every trade (503 KILL_SWITCH) until `resume`. Persisted.
    Halt {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Kill switch off.
    Resume {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Live keys, kill switch, and whether the gateway refuses new trades, failing closed
    /// or full (then exit 69, the JSON still on stdout).
    Status {
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(Subcommand)]
enum KeysOp {
    /// List live keys.
    List {
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Show one key (the stored form, e.g. client:psk:live:order-1).
    Show { key: String },
    /// Operator release of a held key, so that a retry may run: the entry `keys show` gave,
    /// as it was then. Refused while the order that made it is at the executor (`in_flight`
    /// in `keys show`), unless forced.
    Release {
        key: String,
        /// Release even a key whose order is at the executor now: only when you know that
        /// order cannot fill.
        #[arg(long)]
        force: bool,
        /// The `entry` that `keys show` gave: release that entry only, and only in the
        /// state you saw, not one that settled since or a retry's that took the key.
        #[arg(long, value_name = "TAG", value_parser = |t: &str| {
            admin::entry_tag_of(t).map(str::to_owned)
        })]
        entry: String,
    },
}

#[derive(clap::Args)]
struct AdminArgs {
    /// Admin listener: host:port or unix:/path. Default: the config's [admin] listen.
    #[arg(long, global = true)]
    admin: Option<String>,
    /// Config file to read [admin] listen from. Default: /etc/hoox-edge/config.toml, and
    /// without that file the embedded defaults' 127.0.0.1:9980.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
}

/// Parses the command line and runs it. The process exit code comes back.
pub fn main() -> ExitCode {
    // Every command's, not only `serve`'s: a write past a file-size limit (stdout or stderr
    // in a file) would otherwise kill the process, where it should fail with EFBIG and exit
    // with its own code (74 for an answer not written, 78 for a config error).
    crate::app::ignore_file_size_signal();
    // Every command's too: each may read secrets (`serve`, `check-config`, `sign`), and a
    // core dump would write them out.
    let dumpable = crate::platform::nodump::forbid();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_exit(&e),
    };
    let level = log_level(std::env::var_os(LOG_ENV).as_deref());
    crate::platform::log::init(level.as_ref().copied().unwrap_or(log::LevelFilter::Info));
    if let Err(e) = dumpable {
        log::warn!("cannot turn core dumps off (prctl PR_SET_DUMPABLE): {e}");
    }
    if let Err(e) = level {
        log::warn!("{e}");
    }
    match cli.cmd {
        Cmd::Serve {
            config,
            state_dir,
            listen,
            admin,
        } => serve(config, &state_dir, listen, admin),
        Cmd::CheckConfig { config } => check_config(&config),
        Cmd::GenCert { out, names, force } => gen_cert(&out, &names, force),
        Cmd::Sign {
            secret_file,
            body_file,
            timestamp,
        } => sign(&secret_file, body_file.as_deref(), timestamp),
        Cmd::Keys { op, admin } => {
            let (method, path) = match &op {
                KeysOp::List { limit } => ("GET", format!("/keys?limit={limit}")),
                KeysOp::Show { key } => {
                    ("GET", format!("/keys/{}", admin::client::encode_key(key)))
                }
                KeysOp::Release { key, force, entry } => {
                    let (key, tag) = (
                        admin::client::encode_key(key),
                        admin::client::encode_key(entry),
                    );
                    let force = if *force { "&force=1" } else { "" };
                    let path = format!("/keys/{key}/release?entry={tag}{force}");
                    return operator_release(&admin, &path);
                }
            };
            let field = match op {
                KeysOp::List { .. } => "keys",
                _ => "key",
            };
            operator(&admin, method, &path, field)
        }
        Cmd::Halt { admin } => operator(&admin, "POST", "/halt", "halted"),
        Cmd::Resume { admin } => operator(&admin, "POST", "/resume", "halted"),
        // A gateway failing closed answers `/status` (200: it says why), but it takes no
        // trade: exit 69, as for one that cannot answer, so that `status || alert` alerts.
        Cmd::Status { admin } => operator_judged(&admin, "GET", "/status", "serving", not_serving),
    }
}

/// `check-config`: what `serve` would refuse before it serves, without serving. That is the
/// config file (and the certificate and secrets it names) and `TOKIO_WORKER_THREADS`, which
/// `serve` reads too: a check that passed a value `serve` then refuses (exit 78, which
/// systemd does not restart) would let a reload or an upgrade's check wave through a
/// gateway that stays down. Both are checked and said in one run: the config file's first
/// error, and the environment's.
fn check_config(config: &Path) -> ExitCode {
    let loaded = Config::load(config);
    if let Err(e) = &loaded {
        eprintln!("hoox-edge: config error: {e}");
    }
    let workers = workers_from_env();
    if let Err(e) = &workers {
        eprintln!("hoox-edge: config error: {e}");
    }
    let Ok(loaded) = loaded else {
        return ExitCode::from(EX_CONFIG as u8);
    };
    if workers.is_err() {
        return ExitCode::from(EX_CONFIG as u8);
    }
    if loaded.admin.is_none() {
        eprintln!("hoox-edge: warning: {}", crate::app::NO_ADMIN);
    }
    if loaded.on_unknown_outcome == crate::config::OnUnknown::Release {
        eprintln!(
            "hoox-edge: warning: {}: {}",
            config.display(),
            crate::app::RELEASE_ON_UNKNOWN
        );
    }
    // Port 0 is a port the OS picks at each start (tests run so): no sender can know the
    // webhook's, and the operator commands, which read the file, cannot reach the admin
    // face (`halt` among them).
    let picked = |key: &str, whose: &str| {
        eprintln!(
            "hoox-edge: warning: {}: {key}: port 0 is one the OS picks at each start: {whose} \
             cannot know it (the start's log line names it)",
            config.display()
        );
    };
    if loaded.listen.port() == 0 {
        picked("server.listen", "senders");
    }
    if let Some(crate::admin::Listen::Tcp(a)) = &loaded.admin
        && a.port() == 0
    {
        picked("admin.listen", "the operator commands (status, halt, keys)");
    }
    // A file's folder that is not there, or that this user cannot write: what the package's
    // install and the unit's reload check see, as they run this as the service's user.
    let folder_of = |key: &str, file: &Path, absent_ok: Option<&Path>, then: &str| {
        let folder = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let problem = if !folder.is_dir() {
            if absent_ok == Some(folder) {
                return;
            }
            "is not there (yet)"
        } else if !writable(folder) {
            "cannot be written by this user"
        } else {
            return;
        };
        eprintln!(
            "hoox-edge: warning: {}: {key}: the folder {} {problem}: {then}",
            config.display(),
            folder.display()
        );
    };
    // Not an error: the gateway starts without it (a mount not up yet), failing closed
    // until it is there. But a typo passed for ok here refuses every trade.
    let refuses = "a gateway run so refuses every trade (503) until it can write there";
    folder_of("store.path", &loaded.store_path, None, refuses);
    // Nor this, which the unit's `RuntimeDirectory=` makes at each start, after a first
    // install's check: but any other folder missing or not this user's stops `serve` at
    // its start, after `ok` here.
    if let Some(crate::admin::Listen::Unix(socket)) = &loaded.admin {
        let unit_makes = Some(Path::new("/run/hoox-edge"));
        let stops = "a gateway run so cannot listen there, and stops at its start";
        folder_of("admin.listen", socket, unit_makes, stops);
    }
    // Loaded once already, by `Config::load`: this only reads what clients would refuse.
    let tls = loaded.tls.load().ok();
    for w in tls
        .map(|t| t.warnings(&loaded.tls.cert))
        .unwrap_or_default()
    {
        eprintln!("hoox-edge: warning: {w}");
    }
    // Where orders go, as `serve` logs it at start: a config that passes but fills
    // nothing (the paper executor, the default without `[executor]`) says so here too.
    let ok = say(format_args!(
        "{}: ok (executor: {})",
        config.display(),
        loaded.executor.describe()
    ));
    ok.err().unwrap_or(ExitCode::SUCCESS)
}

/// Whether this process may make and remove files in `folder` (access(2), W_OK | X_OK:
/// as the kernel judges this user, root included).
fn writable(folder: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(folder.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a NUL-terminated path that lives across the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// The level `HOOX_EDGE_LOG` names, or why it names none. The caller then logs at info and
/// says why, rather than silently: an operator who asked for debug learns why there is none.
fn log_level(value: Option<&std::ffi::OsStr>) -> Result<log::LevelFilter, String> {
    use log::LevelFilter::{Debug, Error, Info, Warn};
    match value.map(|v| v.to_str()) {
        None | Some(Some("info")) => Ok(Info),
        Some(Some("debug")) => Ok(Debug),
        Some(Some("warn")) => Ok(Warn),
        Some(Some("error")) => Ok(Error),
        Some(v) => Err(format!(
            "{LOG_ENV}={}: not one of debug, info, warn, error; logging at info",
            v.map_or_else(|| "(not UTF-8)".into(), |v| format!("{v:?}"))
        )),
    }
}

fn config_error(e: &crate::config::ConfigError) -> ExitCode {
    eprintln!("hoox-edge: config error: {e}");
    ExitCode::from(EX_CONFIG as u8)
}

/// The environment variable that sets the number of runtime workers (tokio's own name).
const WORKERS_ENV: &str = "TOKIO_WORKER_THREADS";

/// The most workers `TOKIO_WORKER_THREADS` may ask for: far more than any machine the
/// gateway runs on has cores, and few enough that the runtime can start them all (tokio
/// panics when the OS refuses it a thread).
const MAX_WORKERS: usize = 1024;

/// The runtime: one worker per core but one, the core left to the mutex's owner thread, which
/// is busy whenever webhooks are (it syncs every batch and answers every reserve). On 2 cores
/// one worker served 10-20% more webhooks than two, at less CPU each, with the tail at 1k
/// req/s unchanged beyond the noise (docs/BENCHMARKS.md): two workers and the owner on two
/// cores mostly traded the CPU among themselves. `TOKIO_WORKER_THREADS` (tokio's own
/// setting) overrides it.
///
/// On failure it has said why on stderr, and gives the exit code: EX_CONFIG for a bad
/// `TOKIO_WORKER_THREADS`.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    // Read here, not by tokio: tokio panics on a value it cannot use (0, `auto`), which in
    // a release build (panic = abort) is a SIGABRT that systemd restarts, again and again.
    // It reads the variable only when `worker_threads` is not called, and it always is.
    let workers = match workers_from_env() {
        Ok(Some(n)) => n,
        Ok(None) => std::thread::available_parallelism()
            .map_or(1, std::num::NonZero::get)
            .saturating_sub(1)
            .max(1),
        Err(e) => {
            eprintln!("hoox-edge: config error: {e}");
            return Err(ExitCode::from(EX_CONFIG as u8));
        }
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        // A blocking-pool thread, once made, is kept (`serve` makes the first): tokio
        // panics when `spawn_blocking` finds no thread and the OS will not make one, and
        // under a limit on threads (systemd's TasksMax or LimitNPROC, a container's pids
        // limit) that was hyper's DNS lookup of a named executor, with the order's key
        // reserved (the process aborted, the trade held as unknown), or the close at a
        // stop. With a thread kept, tokio queues the call for it instead. Few are ever
        // made: DNS lookups for new executor connections, and the close.
        .thread_keep_alive(Duration::MAX)
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("hoox-edge: cannot start the runtime: {e}");
            ExitCode::FAILURE
        })
}

/// The workers this process's `TOKIO_WORKER_THREADS` asks for: the one reading that `serve`,
/// the operator commands and `check-config` share, so that the check refuses what they do.
fn workers_from_env() -> Result<Option<usize>, String> {
    worker_threads(std::env::var_os(WORKERS_ENV).as_deref())
}

/// The workers `TOKIO_WORKER_THREADS` (its value `value`) asks for, none if it is unset, or
/// why it is not a number of workers.
fn worker_threads(value: Option<&std::ffi::OsStr>) -> Result<Option<usize>, String> {
    let Some(value) = value else { return Ok(None) };
    match value.to_str().map(|v| v.trim().parse::<usize>()) {
        Some(Ok(n)) if (1..=MAX_WORKERS).contains(&n) => Ok(Some(n)),
        _ => Err(format!(
            "{WORKERS_ENV}={}: not a number of worker threads from 1 to {MAX_WORKERS} \
             (unset it for one per core but one)",
            value
                .to_str()
                .map_or_else(|| "(not UTF-8)".into(), |v| format!("{v:?}"))
        )),
    }
}

/// Raises the open-file limit to the hard limit, and warns if `max_connections` still do
/// not fit under it: past it, accepts fail, and so do the executor's connections and the
/// database's reopen, long before the connection cap is reached. An HTTP executor counts
/// them twice: each order out holds a connection of its own to it (HTTP/1.1, one order a
/// connection), and idle ones stay pooled for a while.
fn raise_open_file_limit(max_connections: usize, http_executor: bool) {
    use crate::platform::nofile;
    let soft = match nofile::raise_to_hard() {
        Ok(r) => {
            if r.after > r.before {
                log::info!(
                    "open-file limit (RLIMIT_NOFILE) raised from {} to {}",
                    r.before,
                    r.after
                );
            }
            Some(r.after)
        }
        Err(e) => {
            log::warn!("cannot raise the open-file limit (RLIMIT_NOFILE): {e}");
            nofile::soft_limit().ok()
        }
    };
    let connections = max_connections.saturating_mul(if http_executor { 2 } else { 1 });
    if let Some(soft) = soft
        && let Some(needed) = nofile::shortfall(connections, soft)
    {
        let executor = if http_executor {
            ", as many again for the HTTP executor's,"
        } else {
            ""
        };
        log::warn!(
            "server.max_connections = {max_connections} needs about {needed} open files \
             (the connections{executor} and {} more), over the open-file limit of {soft}: \
             connections will fail before the cap; raise the limit (LimitNOFILE= in the \
             unit, or ulimit -n) or lower server.max_connections",
            nofile::RESERVE,
        );
    }
}

fn serve(
    config: Option<PathBuf>,
    state_dir: &Path,
    listen: Option<std::net::SocketAddr>,
    admin: Option<String>,
) -> ExitCode {
    let embedded = config.is_none();
    let loaded = match &config {
        Some(p) => Config::load(p),
        None => Config::embedded(state_dir),
    };
    let mut config = match loaded {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    if let Some(l) = listen {
        config.set_listen(l);
    }
    if let Some(a) = admin {
        match Listen::parse(&a) {
            Ok(l) => config.set_admin(l),
            Err(e) => {
                eprintln!("hoox-edge: --admin: {e}");
                return ExitCode::from(EX_CONFIG as u8);
            }
        }
    }
    if let Err(e) = config.check_flags() {
        eprintln!("hoox-edge: config error: {e}");
        return ExitCode::from(EX_CONFIG as u8);
    }
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    // Before anything is bound or opened: the limit is the process's, for all of it.
    let http_executor = matches!(config.executor, crate::config::ExecutorKind::Http(_));
    raise_open_file_limit(config.max_connections, http_executor);
    rt.block_on(async move {
        let started = match crate::app::start(config).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("hoox-edge: {e}");
                return match e {
                    crate::app::RunError::Thread(_) => ExitCode::from(EX_OSERR),
                    _ => ExitCode::FAILURE,
                };
            }
        };
        // The blocking pool's first thread, kept for the process's life (`runtime`), made
        // after the owner's so that it never takes the owner's place under a limit; a thread
        // of our own first, so that a limit reached is said, not tokio's panic.
        if let Err(e) = can_make_a_thread() {
            eprintln!("hoox-edge: {}: {e}", crate::platform::NO_THREAD);
            return ExitCode::from(EX_OSERR);
        }
        let _ = tokio::task::spawn_blocking(|| ()).await;
        // One line for people and for tests: where we listen. A stdout that cannot take
        // it does not stop the gateway (its log says the same): it must come up, and fail
        // closed, on a full disk or past a file-size limit.
        let _ = say(format_args!(
            "hoox-edge: gateway on https://{} admin {}",
            started.gateway_addr,
            started.admin_addr.as_deref().unwrap_or("off")
        ));
        if embedded {
            print_first_run(state_dir, started.gateway_addr);
        }
        let closed = started.serve_until_terminated().await;
        // STOPPING=1 and the last STATUS= go out from a thread of their own: let them.
        crate::platform::notify::flush(Duration::from_secs(1));
        match closed {
            // systemd shows the stop failed, not done, and the operator looks (the log
            // says why and what it means).
            crate::mutex::Closed::Failed(_) => ExitCode::from(EX_IOERR),
            crate::mutex::Closed::Clean | crate::mutex::Closed::NotOpen => ExitCode::SUCCESS,
        }
    })
}

/// Whether the OS makes a thread now: one made and ended. Its end is counted against a
/// limit on threads until the kernel has let it go (gone from `/proc/self/task`, a moment
/// after the join), so that is waited for, 100 ms at most: the next thread made would
/// otherwise still meet the limit.
fn can_make_a_thread() -> std::io::Result<()> {
    // SAFETY: gettid takes no argument and cannot fail.
    let probe = std::thread::Builder::new().spawn(|| unsafe { libc::syscall(libc::SYS_gettid) })?;
    let tid = probe
        .join()
        .map_err(|_| std::io::Error::other("the probe thread panicked"))?;
    let task = PathBuf::from(format!("/proc/self/task/{tid}"));
    for _ in 0..100 {
        if !task.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// The exact line to try on a first run. The secret stays in a file: curl reads the header
/// from it, so it never lands in a shell history or a process list.
fn print_first_run(state_dir: &Path, addr: std::net::SocketAddr) {
    let dir = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let _ = say(format_args!("try it:\n  {}", curl_line(&dir, addr))).and_then(|()| {
        say(format_args!(
            "send it twice: the second answer is 409 DUPLICATE."
        ))
    });
}

/// The first run's curl line for the state folder `dir`. Its paths are quoted: the line is
/// meant to be pasted into a shell, and a folder with a space (or a quote) in its path
/// would otherwise split into other words.
fn curl_line(dir: &Path, mut addr: std::net::SocketAddr) -> String {
    // A gateway on every address (`--listen 0.0.0.0:…`) is tried on loopback: that is what
    // the self-signed certificate names, and curl would refuse it at the unspecified one.
    if addr.ip().is_unspecified() {
        use std::net::{Ipv4Addr, Ipv6Addr};
        let ip = if addr.is_ipv4() {
            Ipv4Addr::LOCALHOST.into()
        } else {
            Ipv6Addr::LOCALHOST.into()
        };
        addr.set_ip(ip);
    }
    let cert = shell_quote(&dir.join("tls/cert.pem").display().to_string());
    let header = dir.join("secrets/curl-auth.header");
    let header = shell_quote(&format!("@{}", header.display()));
    format!(
        "curl --cacert {cert} -H {header} \
         -H 'Content-Type: application/json' \
         -d '{{\"exchange\":\"binance\",\"symbol\":\"BTCUSDT\",\"action\":\"LONG\",\"quantity\":0.01}}' \
         https://{addr}/webhook"
    )
}

/// `s` as one word for a POSIX shell: in single quotes, inside which nothing is special but
/// the closing quote, so each `'` in `s` closes the quotes, is escaped, and reopens them.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn gen_cert(out: &Path, names: &[String], force: bool) -> ExitCode {
    // Either file: a key alone may be waiting for its certificate from a CA.
    for file in ["cert.pem", "key.pem"].map(|f| out.join(f)) {
        if file.symlink_metadata().is_ok() && !force {
            eprintln!(
                "hoox-edge: {} exists; use --force to replace it",
                file.display()
            );
            return ExitCode::FAILURE;
        }
    }
    if let Err(e) = crate::config::create_private_dir(out) {
        eprintln!("hoox-edge: {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    match crate::gateway::tls::generate_self_signed(out, names) {
        Ok(()) => {
            let wrote = say(format_args!(
                "wrote {0}/cert.pem and {0}/key.pem",
                out.display()
            ));
            wrote.err().unwrap_or(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("hoox-edge: {e}");
            ExitCode::FAILURE
        }
    }
}

fn sign(secret_file: &Path, body_file: Option<&Path>, timestamp: Option<i64>) -> ExitCode {
    let secrets = match crate::secrets::load_secrets(secret_file) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hoox-edge: {e}");
            return ExitCode::from(EX_CONFIG as u8);
        }
    };
    let Some(secret) = secrets.first() else {
        eprintln!("hoox-edge: {}: no secret", secret_file.display());
        return ExitCode::from(EX_CONFIG as u8);
    };
    let body = match body_file {
        Some(p) => std::fs::read(p),
        None => {
            let mut b = Vec::new();
            std::io::stdin().read_to_end(&mut b).map(|_| b)
        }
    };
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            eprintln!("hoox-edge: cannot read the body: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ts = timestamp.unwrap_or_else(crate::mutex::clock::unix_s);
    let signature = crate::gateway::auth::sign(secret.expose(), ts, &body);
    let headers = say(format_args!(
        "X-Hoox-Timestamp: {ts}\nX-Hoox-Signature: {signature}"
    ));
    headers.err().unwrap_or(ExitCode::SUCCESS)
}

/// Where the admin listener is: --admin, else the [admin] listen of --config (or of
/// `default_config`, if that file exists), else the default.
fn admin_listen(args: &AdminArgs, default_config: &Path) -> Result<Listen, String> {
    if let Some(a) = &args.admin {
        return Listen::parse(a);
    }
    let path = args.config.as_deref().unwrap_or(default_config);
    // Read only the [admin] table: an operator may not be allowed to read the secrets.
    #[derive(serde::Deserialize)]
    struct Partial {
        admin: Option<PartialAdmin>,
    }
    #[derive(serde::Deserialize)]
    struct PartialAdmin {
        listen: Option<String>,
    }
    let text = match crate::secrets::read_regular(path).map(String::from_utf8) {
        Ok(Ok(t)) => t,
        // No config at all: the gateway runs on its embedded defaults, admin included.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && args.config.is_none() => {
            return Listen::parse(DEFAULT_ADMIN);
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        Ok(Err(_)) => return Err(format!("cannot read {}: not UTF-8 text", path.display())),
    };
    let partial = match toml::from_str::<Partial>(&text) {
        Ok(p) => p,
        Err(e) => {
            let (key, message) = crate::config::syntax(&text, &e);
            let said = format!("{}: {key}: {message}", path.display());
            // An edit halfway elsewhere in the file must not keep `halt` from the gateway,
            // which runs on what it read before: the [admin] table read alone.
            match admin_table(&text).and_then(|t| toml::from_str::<Partial>(&t).ok()) {
                Some(p) => {
                    eprintln!("hoox-edge: warning: {said} ([admin] listen read alone)");
                    p
                }
                None => {
                    return Err(format!(
                        "{said} (pass --admin ADDR: the packaged gateway's is \
                         unix:/run/hoox-edge/admin.sock)"
                    ));
                }
            }
        }
    };
    match partial.admin.and_then(|a| a.listen) {
        // Relative to the file, as the gateway that read it took it (`Config::load`).
        Some(l) => Listen::parse_in(&l, path.parent().unwrap_or(Path::new(".")))
            .map_err(|e| format!("{}: admin.listen: {e}", path.display())),
        None => Err(format!(
            "{} has no [admin] listen: that gateway serves no admin API (or pass --admin)",
            path.display()
        )),
    }
}

/// The `[admin]` table of a config alone, from its header to the next (a comment after a
/// header is allowed, as in README's example), as a file of its own. None without one, or
/// when which one is unsure: two `[admin]` headers (one being moved), or one inside a
/// multi-line string (text, not a table), where a guess could send `resume` or a release
/// to another address.
fn admin_table(text: &str) -> Option<String> {
    let header = |line: &str| {
        let line = line.split('#').next().unwrap_or_default().trim();
        let name = line.strip_prefix('[')?.strip_suffix(']')?;
        Some(name.trim().to_string())
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut admin = (0..lines.len()).filter(|&i| header(lines[i]).as_deref() == Some("admin"));
    let (at, None) = (admin.next()?, admin.next()) else {
        return None;
    };
    let before = lines[..at].join("\n");
    if ["\"\"\"", "'''"]
        .iter()
        .any(|q| before.matches(q).count() % 2 == 1)
    {
        return None;
    }
    let body = lines[at + 1..].iter().take_while(|l| header(l).is_none());
    Some(format!(
        "[admin]\n{}\n",
        body.copied().collect::<Vec<_>>().join("\n")
    ))
}

/// An operator command whose 2xx answer carries `field`, as hoox-edge's admin API answers it.
fn operator(args: &AdminArgs, method: &str, path: &str, field: &str) -> ExitCode {
    operator_judged(args, method, path, field, |_| None)
}

/// A release, which the gateway guards, not this command. A gateway older than this
/// command (an upgrade's window, between the package's files and the restart, or an upgrade
/// held by its config check) makes the refusals of its own version only: before 0.2.4 a
/// release freed a key whose order was out, `--entry` unread, and the retry was placed a
/// second time. So a release (always pinned by `--entry`) goes to 0.2.4 or later, which
/// honour it.
fn operator_release(args: &AdminArgs, path: &str) -> ExitCode {
    let (listen, rt) = match admin_face(args) {
        Ok(face) => face,
        Err(code) => return code,
    };
    // A gateway that does not answer is left to the release itself to report.
    if let Ok((200, body)) = rt.block_on(admin::client::request(&listen, "GET", "/status")) {
        // Every hoox-edge's status has said its version: an answer without one is another
        // service's, as `call` tells any answer without what it asked for.
        let Some(v) = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|s| s.get("version")?.as_str().map(str::to_owned))
        else {
            eprintln!(
                "hoox-edge: admin listener {listen} answered its status without \"version\": \
                 not hoox-edge's admin API (another service at that address?): {body}"
            );
            return ExitCode::from(EX_UNAVAILABLE);
        };
        let finish = "or finish the upgrade: check-config with this hoox-edge, then \
                      systemctl restart hoox-edge";
        if older(&v, "0.2.4") {
            eprintln!(
                "hoox-edge: not sent: the gateway at {listen} runs {v}, which reads no \
                 --entry and frees a key whose order is out: {finish}"
            );
            return ExitCode::FAILURE;
        }
    }
    call(&listen, &rt, "POST", path, "released", |_| None)
}

/// Whether version `a` comes before `b`, both `MAJOR.MINOR.PATCH`; one that does not read
/// so counts as older.
fn older(a: &str, b: &str) -> bool {
    let parse = |v: &str| -> Option<Vec<u64>> { v.split('.').map(|n| n.parse().ok()).collect() };
    match (parse(a), parse(b)) {
        (Some(a), Some(b)) => a < b,
        _ => true,
    }
}

/// Whether `body` is a JSON object with a member `field`.
fn has_member(body: &str, field: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body).is_ok_and(|v| v.get(field).is_some())
}

/// Why a `/status` answer (its body) says the gateway takes no trades now, if it does.
/// Anything but `"serving": true` counts: an answer this command cannot read is no proof
/// that the gateway serves, and a script that alerts on the exit code must not be told so.
fn not_serving(body: &str) -> Option<String> {
    let status: serde_json::Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(e) => return Some(format!("its status is not JSON ({e})")),
    };
    if status.get("serving").and_then(serde_json::Value::as_bool) == Some(true) {
        return None;
    }
    // `detail` is the whole reason ("database not open: ..."), `fail_closed` its short name.
    let reason = ["detail", "fail_closed"]
        .iter()
        .find_map(|k| status.get(*k).and_then(serde_json::Value::as_str));
    Some(match reason {
        Some(r) => format!("failing closed: {r}"),
        None => "it says it is not serving".into(),
    })
}

/// An operator command. A 2xx answer goes to stdout; `judge` may still find in it that the
/// gateway cannot take trades (its reason): that exits 69, after the answer is printed.
fn operator_judged(
    args: &AdminArgs,
    method: &str,
    path: &str,
    field: &str,
    judge: fn(&str) -> Option<String>,
) -> ExitCode {
    match admin_face(args) {
        Ok((listen, rt)) => call(&listen, &rt, method, path, field, judge),
        Err(code) => code,
    }
}

/// Where the admin face listens, and a runtime to call it with.
fn admin_face(args: &AdminArgs) -> Result<(Listen, tokio::runtime::Runtime), ExitCode> {
    let listen = admin_listen(args, Path::new(DEFAULT_CONFIG)).map_err(|e| {
        eprintln!("hoox-edge: admin address: {e}");
        ExitCode::from(EX_CONFIG as u8)
    })?;
    Ok((listen, runtime()?))
}

/// One operator request, its answer printed and judged as [`operator_judged`] says. A 2xx
/// answer without `field` (a JSON object's member), or a refusal without a problem `code`,
/// is not hoox-edge's: another service at the admin address, whose `{}` to `halt` once
/// exited 0, the operator told that trading was halted. It exits 69, on stderr.
fn call(
    listen: &Listen,
    rt: &tokio::runtime::Runtime,
    method: &str,
    path: &str,
    field: &str,
    judge: fn(&str) -> Option<String>,
) -> ExitCode {
    // The answer goes to stdout only when it is the data asked for; a refusal (its
    // problem document) goes to stderr, so `keys show K | jq` never parses an error.
    match rt.block_on(admin::client::request(listen, method, path)) {
        Ok((status, body)) if (200..300).contains(&status) && !has_member(&body, field) => {
            eprintln!(
                "hoox-edge: admin listener {listen} answered {status} without \"{field}\": not \
                 hoox-edge's admin API (another service at that address?): {body}"
            );
            ExitCode::from(EX_UNAVAILABLE)
        }
        Ok((status, body)) if (200..300).contains(&status) => {
            if let Err(code) = say(format_args!("{body}")) {
                return code;
            }
            match judge(&body) {
                None => ExitCode::SUCCESS,
                Some(why) => {
                    eprintln!("hoox-edge: the gateway takes no trades now: {why}");
                    ExitCode::from(EX_UNAVAILABLE)
                }
            }
        }
        // hoox-edge's refusals are problem documents with a `code`: anything else (a web
        // server's 404 page) is another service's, not a "no such key".
        Ok((status, body)) if !has_member(&body, "code") => {
            eprintln!(
                "hoox-edge: admin listener {listen} answered {status} without a problem \
                 \"code\": not hoox-edge's admin API (another service at that address?): {body}"
            );
            ExitCode::from(EX_UNAVAILABLE)
        }
        Ok((status, body)) => {
            eprintln!("{body}");
            if status == 503 {
                ExitCode::from(EX_UNAVAILABLE)
            } else {
                ExitCode::FAILURE
            }
        }
        // Made from the command line's key, and too long to send: its input, not the
        // gateway, is at fault, and a script must not retry it as it would a 69.
        Err(e @ admin::client::ClientError::Request(_)) => {
            eprintln!("hoox-edge: not sent: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("hoox-edge: admin listener {listen}: {e}");
            ExitCode::from(EX_UNAVAILABLE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn the_log_level_is_one_of_four_and_anything_else_is_said() {
        use log::LevelFilter::{Debug, Error, Info, Warn};
        let level = |v: &str| log_level(Some(OsStr::new(v)));
        assert_eq!(log_level(None), Ok(Info));
        assert_eq!(level("info"), Ok(Info));
        assert_eq!(level("debug"), Ok(Debug));
        assert_eq!(level("warn"), Ok(Warn));
        assert_eq!(level("error"), Ok(Error));
        for bad in ["DEBUG", "trace", "", "warning"] {
            let e = level(bad).unwrap_err();
            assert!(e.starts_with(&format!("HOOX_EDGE_LOG={bad:?}: ")), "{e}");
            assert!(e.ends_with("logging at info"), "{e}");
        }
        let e = log_level(Some(OsStr::from_bytes(b"\xff"))).unwrap_err();
        assert!(e.contains("(not UTF-8)"), "{e}");
    }

    #[test]
    fn the_worker_threads_are_a_positive_number_or_unset() {
        let workers = |v: &str| worker_threads(Some(OsStr::new(v)));
        assert_eq!(worker_threads(None), Ok(None));
        assert_eq!(workers("1"), Ok(Some(1)));
        assert_eq!(workers("3"), Ok(Some(3)));
        assert_eq!(workers(" 2\n"), Ok(Some(2)));
        assert_eq!(workers("1024"), Ok(Some(1024)));
        for bad in ["0", "auto", "", "-1", "1.5", "1025", "99999999999999999999"] {
            let e = workers(bad).unwrap_err();
            assert!(
                e.starts_with(&format!("TOKIO_WORKER_THREADS={bad:?}: ")),
                "{e}"
            );
        }
        let e = worker_threads(Some(OsStr::from_bytes(b"\xff"))).unwrap_err();
        assert!(e.contains("(not UTF-8)"), "{e}");
    }

    /// `status` exits 0 only on an answer that says `"serving": true`: failing closed, or an
    /// answer it cannot read, is a reason (for exit 69), never a silent success.
    #[test]
    fn status_succeeds_only_on_an_answer_that_says_it_serves() {
        assert_eq!(not_serving(r#"{"serving":true,"halted":true}"#), None);
        let why = not_serving(
            r#"{"serving":false,"fail_closed":"not_open","detail":"database not open: locked"}"#,
        );
        assert_eq!(
            why.as_deref(),
            Some("failing closed: database not open: locked")
        );
        let why = not_serving(r#"{"serving":false,"fail_closed":"timeout"}"#);
        assert_eq!(why.as_deref(), Some("failing closed: timeout"));
        assert!(not_serving(r#"{"live_keys":0}"#).is_some());
        assert!(not_serving("<html>").unwrap().contains("not JSON"));
    }

    /// The words a POSIX shell makes of the curl line, `curl` left out: as curl would get
    /// them when the line is pasted.
    fn words_of(line: &str) -> Vec<String> {
        let args = line.strip_prefix("curl ").expect(line);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s\\0' {args}"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{line}: {out:?}");
        String::from_utf8(out.stdout)
            .unwrap()
            .split_terminator('\0')
            .map(String::from)
            .collect()
    }

    /// The first run's state folder may sit under a path with a space: the printed line
    /// still names its two files as one word each when pasted, and a URL curl can verify.
    #[test]
    fn the_curl_line_quotes_a_path_with_a_space() {
        let dir = Path::new("/home/op/my state");
        let line = curl_line(dir, "127.0.0.1:8443".parse().unwrap());
        assert!(
            line.contains("--cacert '/home/op/my state/tls/cert.pem' ")
                && line.contains("-H '@/home/op/my state/secrets/curl-auth.header' "),
            "{line}"
        );
        let words = words_of(&line);
        assert_eq!(
            words[..4],
            [
                "--cacert",
                "/home/op/my state/tls/cert.pem",
                "-H",
                "@/home/op/my state/secrets/curl-auth.header",
            ]
        );
        assert_eq!(words.last().unwrap(), "https://127.0.0.1:8443/webhook");
        // A gateway on every address is tried on the loopback its certificate names.
        for (listen, url) in [
            ("0.0.0.0:8443", "https://127.0.0.1:8443/webhook"),
            ("[::]:9443", "https://[::1]:9443/webhook"),
            ("[::1]:8443", "https://[::1]:8443/webhook"),
        ] {
            let line = curl_line(dir, listen.parse().unwrap());
            assert_eq!(words_of(&line).last().unwrap(), url, "{listen}");
        }
    }

    /// A single quote in the path closes the quotes, is escaped, and reopens them: `'\''`.
    #[test]
    fn the_curl_line_quotes_a_path_with_a_single_quote() {
        let dir = Path::new("/home/o'brien/state");
        let line = curl_line(dir, "127.0.0.1:8443".parse().unwrap());
        assert!(
            line.contains(r"--cacert '/home/o'\''brien/state/tls/cert.pem' "),
            "{line}"
        );
        let words = words_of(&line);
        assert_eq!(
            words[..4],
            [
                "--cacert",
                "/home/o'brien/state/tls/cert.pem",
                "-H",
                "@/home/o'brien/state/secrets/curl-auth.header",
            ]
        );
    }

    #[test]
    fn operator_commands_find_the_admin_listener() {
        let dir = tempfile::tempdir().unwrap();
        let args = |admin: Option<&str>, config: Option<PathBuf>| AdminArgs {
            admin: admin.map(Into::into),
            config,
        };
        let absent = dir.path().join("absent.toml");
        let tcp = |s: &str| Ok(Listen::Tcp(s.parse().unwrap()));
        // Nothing given and no installed config: the embedded default.
        assert_eq!(admin_listen(&args(None, None), &absent), tcp(DEFAULT_ADMIN));
        // A config named on the command line must be there.
        let e = admin_listen(&args(None, Some(absent.clone())), &absent).unwrap_err();
        assert!(
            e.starts_with("cannot read ") && e.contains("absent.toml"),
            "{e}"
        );
        // The installed config's [admin], or a config named; --admin before both.
        let installed = dir.path().join("installed.toml");
        std::fs::write(&installed, "[admin]\nlisten = \"127.0.0.1:7001\"\n").unwrap();
        let named = dir.path().join("named.toml");
        std::fs::write(&named, "[admin]\nlisten = \"unix:/run/x.sock\"\n").unwrap();
        assert_eq!(
            admin_listen(&args(None, None), &installed),
            tcp("127.0.0.1:7001")
        );
        assert_eq!(
            admin_listen(&args(None, Some(named.clone())), &installed),
            Ok(Listen::Unix("/run/x.sock".into()))
        );
        assert_eq!(
            admin_listen(&args(Some("127.0.0.1:7002"), Some(named)), &installed),
            tcp("127.0.0.1:7002")
        );
        // A relative socket is beside the config, where the gateway that read it put it.
        let relative = dir.path().join("relative.toml");
        std::fs::write(&relative, "[admin]\nlisten = \"unix:run/admin.sock\"\n").unwrap();
        assert_eq!(
            admin_listen(&args(None, Some(relative)), &installed),
            Ok(Listen::Unix(dir.path().join("run/admin.sock")))
        );
        // A listen that does not parse is named with its file, as `serve` names it.
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "[admin]\nlisten = \"127.0.0.1\"\n").unwrap();
        let e = admin_listen(&args(None, Some(bad.clone())), &installed).unwrap_err();
        assert!(
            e.starts_with(&format!("{}: admin.listen: ", bad.display())),
            "{e}"
        );
        // A syntax error elsewhere (an edit halfway) leaves [admin] listen readable alone;
        // one in [admin] itself, or no [admin] table to read alone, is said with the way
        // out. Read alone, the table ends at the next header, a comment after it or not.
        let editing = dir.path().join("editing.toml");
        for (text, want) in [
            (
                "[store]\nttl = \"1s\"\nttl = \"2s\"\n[admin] # ops\nlisten = \"127.0.0.1:7003\"\n[executor]\nurl = \"x\n",
                tcp("127.0.0.1:7003"),
            ),
            (
                "[admin]\nlisten = \"unix:a.sock\"\n\n  [ executor ]\nurl = \"\n",
                Ok(Listen::Unix(dir.path().join("a.sock"))),
            ),
        ] {
            std::fs::write(&editing, text).unwrap();
            assert_eq!(
                admin_listen(&args(None, Some(editing.clone())), &installed),
                want,
                "{text}"
            );
        }
        for text in [
            "[admin]\nlisten = \"127.0.0.1:7003\n",
            "[server]\nlisten = \"x\n",
            "admin.listen = \"127.0.0.1:1\"\n[x]\ny = \"\n",
            // Which [admin] is unsure: two of them, or one in a multi-line string.
            "[admin]\nlisten = \"127.0.0.1:1\"\n[x]\ny = \"\n[admin]\nlisten = \"127.0.0.1:2\"\n",
            "[x]\nnote = \"\"\"\n[admin]\nlisten = \"127.0.0.1:9\"\n\"\"\"\ny = \"\n",
            "[x]\nnote = '''\n[admin]\nlisten = \"127.0.0.1:9\"\n'''\ny = \"\n",
        ] {
            std::fs::write(&editing, text).unwrap();
            let e = admin_listen(&args(None, Some(editing.clone())), &installed).unwrap_err();
            assert!(
                e.contains("line ") && e.contains("pass --admin"),
                "{text}: {e}"
            );
        }
        // A config without [admin] serves no admin API: said, not guessed.
        std::fs::write(&installed, "[server]\n").unwrap();
        let e = admin_listen(&args(None, None), &installed).unwrap_err();
        assert!(e.contains("has no [admin] listen"), "{e}");
    }
}
