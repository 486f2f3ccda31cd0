//! hoox-load: size your box. Drives the gateway over its public TLS interface only, plays the
//! executor it forwards to (the ledger, which notices a key forwarded twice), and measures the
//! one thing no webhook can beat, a write + fdatasync on the state directory's filesystem.

mod fsync;
mod ledger;
mod run;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser)]
#[command(about = "Load generator, ledger executor and fsync baseline for hoox-edge")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Send trade webhooks over N TLS connections and report throughput and latency.
    Run(run::Args),
    /// Run a ledger executor: answers 200 {"success":true}, records every Idempotency-Key.
    Ledger {
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
    },
    /// Fetch a ledger's counts; exit 1 if any key was forwarded twice.
    CheckLedger {
        /// e.g. http://127.0.0.1:9000/ledger
        #[arg(long)]
        ledger: String,
        #[arg(long)]
        json: bool,
    },
    /// Time write + fdatasync in DIR: the floor under any durable reserve.
    Fsync {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 1000)]
        count: u32,
        /// Bytes written before each fdatasync.
        #[arg(long, default_value_t = 4096)]
        size: usize,
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
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
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        match command {
            Command::Run(args) => run::run(args).await,
            Command::Ledger { listen } => ledger::serve(listen).await,
            Command::CheckLedger { ledger, json } => ledger::check(&ledger, json).await,
            // Blocking on purpose: nothing else runs, and the timings must not include a hop.
            Command::Fsync { dir, count, size, json } => fsync::run(&dir, count, size, json),
        }
    })
}
