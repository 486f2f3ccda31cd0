//! The OS around us: systemd notification, journald or stderr logging. Uses nothing of ours.

pub mod log;
pub mod notify;
