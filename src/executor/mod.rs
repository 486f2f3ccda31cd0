//! Where an accepted trade goes.

pub mod http;
pub mod paper;
