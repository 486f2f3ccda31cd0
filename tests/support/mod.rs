//! What the integration tests share: certificates, a TLS client for the gateway, and a mock
//! executor. Each test file uses a part of it.
#![allow(dead_code)]

pub mod client;
pub mod executor;
pub mod gateway;
pub mod h2raw;
pub mod pki;
pub mod stream;
