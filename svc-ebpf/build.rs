//! Rebuild when the linker changes: the crate has an undeclared dependency on `bpf-linker`.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(_) => println!("cargo:rerun-if-env-changed=PATH"),
    }
}
