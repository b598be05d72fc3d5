//! `flow_copy`: copies the entries of the flows user space names into an
//! array, all in one run. Never attached: user space runs it with
//! `BPF_PROG_TEST_RUN` (a frame whose bytes after the Ethernet header hold the
//! count) after writing the keys with one batch update, and reads the copies
//! with one batch look-up. Three syscalls for up to `COPY_BATCH` flows, where
//! a look-up each is one syscall a flow: the moved flows of a node's read
//! (~5,000 a second at 10,000 connections) were the largest part of
//! hystall's own CPU.

use aya_ebpf::{
    macros::{classifier, map},
    maps::Array,
    programs::TcContext,
};
use hystall_common::{COPY_BATCH, FlowKey, FlowStats};

use crate::quic_flow::FLOWS;

/// The keys to copy, in slots 0..count.
#[map]
pub static COPY_KEYS: Array<FlowKey> = Array::with_max_entries(COPY_BATCH, 0);
/// Their entries, in the same slots; `ifindex` 0 for a flow not in the map
/// (every entry the classifier makes has its interface's, never 0).
#[map]
pub static COPY_OUT: Array<FlowStats> = Array::with_max_entries(COPY_BATCH, 0);

/// Where the count is in the frame (after an Ethernet header: the kernel
/// wants one).
const COUNT_AT: usize = 14;

/// Returns how many slots it filled.
#[classifier]
pub fn flow_copy(ctx: TcContext) -> i32 {
    let n: u32 = ctx.load(COUNT_AT).unwrap_or(0);
    let mut i = 0u32;
    while i < COPY_BATCH && i < n {
        let Some(key) = COPY_KEYS.get(i) else { break };
        // SAFETY: a map value pointer of FLOWS, read by the update helper as
        // the look-up syscall reads it (other CPUs may be adding to its
        // counters: each u64 is copied whole). The helper copies, not the
        // program: a 240-byte copy in the program is a loop per slot that
        // the verifier walks slot by slot.
        match unsafe { FLOWS.get(key) } {
            Some(st) => {
                if COPY_OUT.set(i, st, 0).is_err() {
                    break;
                }
            }
            None => match COPY_OUT.get_ptr_mut(i) {
                // SAFETY: slot `i` of the array.
                Some(out) => unsafe { (*out).ifindex = 0 },
                None => break,
            },
        }
        i += 1;
    }
    i as i32
}
