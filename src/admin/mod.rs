//! The operator's face: health, readiness, metrics, keys (loopback or Unix socket).

pub mod client;
