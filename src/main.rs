//! The `hoox-edge` binary: everything lives in the library; see `cli.rs`.

fn main() -> std::process::ExitCode {
    hoox_edge::platform::alloc::tune();
    hoox_edge::cli::main()
}
