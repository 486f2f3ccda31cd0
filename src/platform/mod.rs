//! The OS around us: the allocator of the static build (`alloc`), systemd notification
//! (`notify`) and logging to the journal or stderr (`log`). Uses nothing of ours, so every
//! other module may use it.

pub mod alloc;
pub mod log;
pub mod notify;
