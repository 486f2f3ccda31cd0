//! The allocator of every build, for every binary that links this library.
//!
//! A `#[global_allocator]` in a library applies to each binary that links it, so the gateway,
//! the `bare-tls` baseline and the `hoox-load` generator share one allocator per build and a
//! benchmark compares like with like. A binary links the library only if it uses something of
//! it: each calls [`tune`] first thing in `main`, which is also what makes the tuning apply.

/// musl's own malloc takes one lock for every allocation, and the gateway allocates on every
/// request from every tokio worker: under load the workers queue on that lock (mimalloc:
/// +14% req/s at 16 connections, +13% at 64, docs/BENCHMARKS.md). glibc's malloc has
/// per-thread arenas but was still a fifth of the gateway's CPU in a profile; mimalloc cut
/// the gnu build's CPU per response by ~12% at 16 connections.
/// One allocator everywhere also means the host build measures what the static build runs.
#[cfg(target_os = "linux")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Call first thing in `main`, before the runtime starts threads.
///
/// mimalloc's defaults trade memory for speed in a way an appliance cannot afford: it
/// commits its first arena eagerly (idle RSS 5.5 -> 16.4 MB) and keeps freed pages for a
/// second (100k live keys: 37 -> 72 MB after a restart, the index rebuild's garbage kept).
/// Committing on demand and returning pages at once costs no measurable req/s.
pub fn tune() {
    #[cfg(target_os = "linux")]
    {
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
        // mimalloc asks for transparent huge pages on its arenas, so a first touch faults in
        // 2 MiB at once. The gnu build, whose first arena mimalloc sets up before `main` (too
        // early for the options above), held 21.9 MB idle that way, 12 MB of it in huge
        // pages; 12.5 MB with them off. Failure only costs memory, so it is ignored.
        // SAFETY: PR_SET_THP_DISABLE sets a flag of this process; no memory is passed.
        let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use libmimalloc_sys::{mi_is_in_heap_region, mi_option_get};

    #[test]
    fn the_library_allocator_is_mimalloc_and_tuned() {
        let boxed = Box::new([7u8; 64]);
        // SAFETY: only reads whether an address lies in mimalloc's arenas.
        assert!(unsafe { mi_is_in_heap_region(boxed.as_ptr().cast()) });
        super::tune();
        // SAFETY: reads one entry of the option table; 4 and 15 as in `tune`.
        assert_eq!(unsafe { (mi_option_get(4), mi_option_get(15)) }, (0, 0));
    }
}
