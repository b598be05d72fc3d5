//! hystall's kernel programs.
//!
//! They only aggregate per socket (keyed by socket cookie) in maps and write an
//! event to the ring buffer when a socket changes state; every decision is made
//! in user space. Struct and record offsets come from user space (read from the
//! running kernel), so nothing here is tied to one kernel build.
#![no_std]
#![allow(internal_features)]
#![feature(core_intrinsics)]
#![no_main]

mod flow_copy;
mod go_tls;
mod maps;
mod proc_exec;
mod quic_flow;
mod sock_send;
mod sock_state;
mod syscalls;
mod tcp_ack;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
