//! The `hoox-edge` binary: everything lives in the library; see `cli.rs`.

/// musl's own malloc takes one lock for every allocation, and the gateway allocates on every
/// request from every tokio worker: under load the workers queue on that lock (mimalloc:
/// +26% req/s at 16 connections, +112% at 64, docs/BENCHMARKS.md). glibc's malloc has per-thread arenas,
/// so only the static musl build swaps allocator.
#[cfg(target_env = "musl")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's defaults trade memory for speed in a way an appliance cannot afford: it
/// commits its first arena eagerly (idle RSS 5.5 -> 16.4 MB) and keeps freed pages for a
/// second (100k live keys: 37 -> 72 MB after a restart, the index rebuild's garbage kept).
/// Committing on demand and returning pages at once costs no measurable req/s.
#[cfg(target_env = "musl")]
fn tune_allocator() {
    // mimalloc v3's `mi_option_e` indices, which libmimalloc-sys 0.1.49 does not name; the
    // crate is pinned (`=`) in Cargo.toml so that these cannot drift from the C library.
    const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: mi_option_set only stores a value in mimalloc's option table; any option
    // index and value is accepted, and both are read when mimalloc next reserves or purges.
    unsafe {
        libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0);
        libmimalloc_sys::mi_option_set(PURGE_DELAY, 0);
    }
}

fn main() -> std::process::ExitCode {
    #[cfg(target_env = "musl")]
    tune_allocator();
    hoox_edge::cli::main()
}
