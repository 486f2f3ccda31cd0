//! For tests that run their own test binary again as a child process (a second process
//! holding the lock, a crash, a signal raised at a moment of its own). Not for the gateway.

use std::process::Command;

/// The environment variable naming a program that runs the test binary (CI's aarch64
/// tests: `qemu-aarch64-static`, as cargo's `CARGO_TARGET_<triple>_RUNNER` does for the
/// parent, where the kernel cannot exec an aarch64 binary itself).
pub const RUNNER_ENV: &str = "HOOX_TEST_RUNNER";

/// The command that runs the test `test` of the current test binary alone, with its output
/// shown: through `HOOX_TEST_RUNNER` when it is set.
pub fn rerun(test: &str) -> std::io::Result<Command> {
    let exe = std::env::current_exe()?;
    let mut cmd = match std::env::var_os(RUNNER_ENV).filter(|r| !r.is_empty()) {
        Some(runner) => {
            let mut c = Command::new(runner);
            c.arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.args([test, "--exact", "--test-threads=1", "--nocapture"]);
    Ok(cmd)
}

/// Whether a child run by [`rerun`] ran its one test and passed it. Exit 0 alone says
/// neither: a name that matches no test (one renamed, or mistyped) runs none, and exits 0.
pub fn passed(out: &std::process::Output) -> bool {
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed")
}
