//! The CRI v1 protobuf (`data/cri-api/api.proto`, see its README) compiled into the tests' CRI
//! client (`src/cri.rs`): protox parses it (pure Rust, no `protoc`), tonic's generator writes
//! its messages and clients.

fn main() {
    let dir = "data/cri-api";
    println!("cargo:rerun-if-changed={dir}/api.proto");
    let files =
        protox::compile(["api.proto"], [dir]).unwrap_or_else(|e| panic!("{dir}/api.proto: {e:?}"));
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(files)
        .unwrap_or_else(|e| panic!("generating the CRI client from {dir}/api.proto: {e}"));
}
