//! `run(config, shutdown)`: wires the mutex, the executor, the gateway and the admin face.
//! (to be written)

/// Tells `run` to stop.
pub struct Shutdown;

pub async fn run() {}
