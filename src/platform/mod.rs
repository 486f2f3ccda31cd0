//! The OS around us: the allocator of the static build (`alloc`), systemd notification
//! (`notify`), logging to the journal or stderr (`log`), the open-file limit (`nofile`) and
//! no core dumps (`nodump`).
//! Uses nothing of ours, so every other module may use it.

pub mod alloc;
pub mod log;
pub mod nodump;
pub mod nofile;
pub mod notify;

/// What `serve` says, before exit 71, when the OS will not make a thread it needs.
pub const NO_THREAD: &str = "cannot start a thread (a limit on this user's processes and \
    threads: LimitNPROC, TasksMax, a container's pids limit)";
