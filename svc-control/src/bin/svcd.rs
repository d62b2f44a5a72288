//! svcd, the host supervisor. The API server and sandbox lifecycle arrive with the svcd issue;
//! for now it only loads and validates its configuration.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    eprintln!("svcd: not yet implemented");
    std::process::ExitCode::from(64)
}
