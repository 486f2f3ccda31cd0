//! The OS around us: the allocator of the static build (`alloc`), systemd notification
//! (`notify`), logging to the journal or stderr (`log`) and the open-file limit (`nofile`).
//! Uses nothing of ours, so every other module may use it.

pub mod alloc;
pub mod log;
pub mod nofile;
pub mod notify;
