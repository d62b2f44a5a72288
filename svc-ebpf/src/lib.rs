//! Library target so `cargo clippy --all-targets` can check the parser on the host.
#![no_std]

pub mod btf;
pub mod parse;
