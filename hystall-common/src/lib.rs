//! Types shared by the kernel programs (`hystall-ebpf`) and user space (`hystall`).
//!
//! Everything here is `#[repr(C)]`, `Copy` and free of pointers, because it crosses
//! the kernel boundary through BPF maps and the ring buffer. Times are
//! `bpf_ktime_get_ns()` values (CLOCK_MONOTONIC, nanoseconds).
#![no_std]

pub mod config;
pub mod decrypt;
pub mod flow;
pub mod mark;
pub mod sock;
pub mod tls;

pub use config::*;
pub use decrypt::*;
pub use flow::*;
pub use mark::*;
pub use sock::*;
pub use tls::*;
