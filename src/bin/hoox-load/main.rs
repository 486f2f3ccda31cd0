//! hoox-load: size your box. Drives the gateway over its public TLS interface only, plays the
//! executor it forwards to (the ledger, which notices a key forwarded twice), and measures the
//! two things no webhook can beat: a synced write on the state directory's filesystem, and a
//! round trip between two threads (every reserve makes one, to the mutex's owner and back).

mod fsync;
mod handoff;
mod ledger;
mod run;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser)]
#[command(
    about = "Load generator, ledger executor, and fsync and hand-off baselines for hoox-edge"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Send trade webhooks over N TLS connections and report throughput and latency.
    ///
    /// Exit codes: 0 every answer served (2xx, or 409 in a run that may repeat a trade:
    /// --dup-ratio, --keys, --key-prefix; with --replay-keys, 409 or a stored answer marked
    /// Idempotent-Replayed); 1 the ledger (--ledger) saw a key
    /// forwarded twice or an order without a key; 2 the run could not start, or the ledger
    /// could not be read after it (the run's report is printed first); 3 no answer at
    /// all; 4 some answer was not served, or some request failed in transport (a
    /// connect, an I/O error, a timeout), unless --expect-errors; 5 with --replay-keys, a
    /// replayed key answered 2xx (forwarded again); 6 with --replay-keys, a replayed key
    /// answered neither 409 nor its stored answer (not shown held). --expect-errors
    /// excuses neither.
    Run(Box<run::Args>),
    /// Run a ledger executor: answers 200 {"success":true}, records every Idempotency-Key.
    Ledger {
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
    },
    /// Fetch a ledger's counts; exit 1 if any key was forwarded twice (a fingerprint, its
    /// trade within 58 s of its last, whatever its minute) or any order came without a key.
    CheckLedger {
        /// e.g. http://127.0.0.1:9000/ledger
        #[arg(long)]
        ledger: String,
        #[arg(long)]
        json: bool,
        /// Also write every key the ledger has taken to this file, one a line, as the
        /// gateway forwarded it (`client:{identity}:{mode}:{key}`, or a fingerprint).
        #[arg(long)]
        write_keys: Option<PathBuf>,
    },
    /// Write a self-signed certificate for localhost, 127.0.0.1 and ::1: DIR/cert.pem and
    /// DIR/key.pem, replacing any there.
    GenCert {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Time write + fdatasync in DIR: the floor under any durable reserve.
    Fsync {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
        /// Bytes written before each fdatasync, at most 1 MiB (the journal file's size).
        #[arg(long, default_value_t = 4096)]
        size: usize,
        /// Open loop: `count` writes scheduled this many per second, each fdatasync covering
        /// every write due by then (group commit), each timed from its schedule: the disk's
        /// own latency floor at that rate, queueing behind a slow sync included.
        #[arg(long, value_parser = run::parse_rate)]
        rate: Option<f64>,
        /// Threads, each syncing its own writes in its own pages of the one file. Closed loop:
        /// whether the disk overlaps flushes (syncs/s grows with writers at the same latency).
        /// With --rate: a group commit with this many syncs in flight.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
        writers: u32,
        /// Write through O_DIRECT | O_DSYNC, as the mutex's journal does where the file system
        /// allows, instead of write + fdatasync. --size must be a multiple of 4096.
        #[arg(long)]
        direct: bool,
        #[arg(long)]
        json: bool,
    },
    /// Time a round trip between two threads over bounded channels, the other one asleep in
    /// between: the floor under each reserve's hand-off to the mutex's owner thread.
    Handoff {
        #[arg(long, default_value_t = 20_000)]
        count: u32,
        /// Hold both threads to one CPU, so that no wake crosses CPUs.
        #[arg(long)]
        one_cpu: bool,
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    // The gateway's allocator: on musl, musl's one-lock malloc would make the generator the
    // bottleneck of the static build's benchmark.
    hoox_edge::platform::alloc::tune();
    let cli = Cli::parse();
    match tokio_main(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hoox-load: {e}");
            ExitCode::from(2)
        }
    }
}

fn tokio_main(command: Command) -> Result<ExitCode, Error> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match command {
            Command::Run(args) => run::run(*args).await,
            Command::Ledger { listen } => ledger::serve(listen).await,
            Command::CheckLedger {
                ledger,
                json,
                write_keys,
            } => ledger::check(&ledger, json, write_keys.as_deref()).await,
            Command::GenCert { dir } => gen_cert(&dir),
            // Blocking on purpose: nothing else runs, and the timings must not include a hop.
            Command::Fsync {
                dir,
                count,
                size,
                rate,
                writers,
                direct,
                json,
            } => {
                let mode = fsync::Mode {
                    rate,
                    writers,
                    direct,
                };
                fsync::run(&dir, count, size, mode, json)
            }
            // Blocking too: the runtime's own threads stay asleep meanwhile.
            Command::Handoff {
                count,
                one_cpu,
                json,
            } => {
                let placement = if one_cpu {
                    handoff::Placement::OneCpu
                } else {
                    handoff::Placement::Any
                };
                handoff::run(count, placement, json)
            }
        }
    })
}

/// The benchmark's certificate, so the bare server and the gateway present the very same one.
fn gen_cert(dir: &std::path::Path) -> Result<ExitCode, Error> {
    // The gateway's own: the bench's servers present what `hoox-edge gen-cert` makes, and
    // a key already there (a second run in the same folder) is replaced, owner-only.
    let names = hoox_edge::gateway::tls::LOOPBACK_NAMES.map(String::from);
    hoox_edge::config::create_private_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    hoox_edge::gateway::tls::generate_self_signed(dir, &names)?;
    println!(
        "hoox-load: wrote {0}/cert.pem and {0}/key.pem",
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}
