//! The TLS face: accept loop, connection limits, graceful shutdown. Knows nothing of redb.

pub mod auth;
pub mod idem;
pub mod limits;
pub mod problem;
pub mod tls;
pub mod trade;
pub mod webhook;
