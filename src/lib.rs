//! hoox-edge: the idempotency gateway at the door of a trading system.
//!
//! The folders are the architecture. A webhook travels one way:
//! `gateway` (TLS, parse, authenticate, resolve the key) → `mutex` (reserve) →
//! `executor` (place the order) → `mutex` (commit or release) → the answer.
//! `admin` is the operator's face; `platform` is the OS around us (systemd, journald,
//! signals). Only `gateway::webhook` orchestrates: the mutex knows nothing of the
//! gateway or the executor, and the executor only names the mutex's grants, to settle an
//! order it holds.

pub mod admin;
pub mod app;
pub mod cli;
pub mod config;
pub mod executor;
pub mod gateway;
pub mod metrics;
pub mod mutex;
pub mod platform;
pub mod secrets;
#[doc(hidden)]
pub mod testing;

pub use app::run;
