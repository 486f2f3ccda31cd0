//! PLACEHOLDER until the owner loop lands: answers every command with Unavailable
//! (fail closed). Replaced by the real owner.

use std::sync::Arc;
use std::sync::mpsc::Receiver;

use super::{Clock, Command, Config, Decision, Shared, Status, Unavailable};

pub(super) fn spawn(
    _config: Config,
    _clock: Clock,
    rx: Receiver<Command>,
    _shared: Arc<Shared>,
    _stall_hook: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let u = || Unavailable::NotOpen("placeholder".into());
        while let Ok(cmd) = rx.recv() {
            match cmd {
                Command::Reserve(_, tx) => drop(tx.send(Decision::Unavailable(u()))),
                Command::Commit(_, _, tx) | Command::Release(_, tx) | Command::SetHalted(_, tx) => {
                    drop(tx.send(Err(u())))
                }
                Command::Get(_, tx) => drop(tx.send(Err(u()))),
                Command::List(_, tx) => drop(tx.send(Err(u()))),
                Command::ForceRelease(_, tx) => drop(tx.send(Err(u()))),
                Command::Ping(tx) => drop(tx.send(Status {
                    live_keys: 0,
                    halted: false,
                    fail_closed: Some(u()),
                })),
                Command::Stall(_) => {}
                Command::Shutdown => break,
            }
        }
    })
}
