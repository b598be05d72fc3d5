//! `--decrypt`: a uprobe at the entry of Go's `crypto/tls.(*Config).writeKeyLog`
//! (found by user space in the binary's `.gopclntab`). Go's register ABI
//! (ABIInternal, amd64) passes the method's arguments in RAX, RBX, RCX, RDI,
//! RSI, R8, R9, R10, R11, so for
//! `func (c *Config) writeKeyLog(label string, clientRandom, secret []byte) error`:
//! c = RAX, label = (RBX ptr, RCX len), clientRandom = (RDI ptr, RSI len, R8 cap),
//! secret = (R9 ptr, R10 len, R11 cap). The function is called for every TLS
//! 1.3 secret whether or not a key log writer is set (it checks that itself).
//! amd64 only: user space refuses `--decrypt` on other architectures.

use aya_ebpf::{helpers::bpf_probe_read_user_buf, macros::map, macros::uprobe, maps::RingBuf, programs::ProbeContext};
use hystall_common::{CLIENT_RANDOM_LEN, SECRET_LABEL_MAX, SECRET_MAX, SECRETS_RING_BYTES, TlsSecret, counter};

use crate::maps::{bump, current_ids, now_ns, wakeup};

/// Secrets for user space. Only processes user space attached the probe to
/// (the watched servers) write here.
#[map]
pub static SECRETS: RingBuf = RingBuf::with_byte_size(SECRETS_RING_BYTES, 0);

#[uprobe]
pub fn go_tls_keylog(ctx: ProbeContext) -> u32 {
    match try_go_tls_keylog(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

#[inline(always)]
fn try_go_tls_keylog(ctx: &ProbeContext) -> Result<(), ()> {
    let regs = unsafe { &*ctx.regs };
    let (label, label_len) = (regs.rbx as *const u8, regs.rcx as usize);
    let (random, random_len) = (regs.rdi as *const u8, regs.rsi as usize);
    let (secret, secret_len) = (regs.r9 as *const u8, regs.r10 as usize);
    let Some(mut entry) = SECRETS.reserve::<TlsSecret>(0) else {
        bump(counter::SECRETS_LOST);
        return Err(());
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points at a reserved record of the right size; every
    // user-memory read goes through bpf_probe_read_user.
    unsafe {
        (*ev).tgid = current_ids().0;
        (*ev).ts_ns = now_ns();
        (*ev).label_len = label_len as u32;
        (*ev).random_len = random_len as u32;
        (*ev).secret_len = secret_len as u32;
        (*ev).label = [0; SECRET_LABEL_MAX];
        (*ev).random = [0; CLIENT_RANDOM_LEN];
        (*ev).secret = [0; SECRET_MAX];
        // Fixed-size reads (the verifier wants constant sizes); the lengths
        // say how much is real. A read past a short buffer fails as a whole
        // only at an unmapped page: user space checks the lengths.
        let ok = bpf_probe_read_user_buf(label, &mut (*ev).label).is_ok()
            && bpf_probe_read_user_buf(random, &mut (*ev).random).is_ok()
            && read_secret(secret, secret_len, &mut (*ev).secret);
        if !ok {
            (*ev).label_len = 0;
        }
    }
    entry.submit(wakeup(&SECRETS, SECRETS_RING_BYTES));
    Ok(())
}

/// Copies a 32- or 48-byte secret (the SHA-256 and SHA-384 suites).
#[inline(always)]
unsafe fn read_secret(src: *const u8, len: usize, dst: &mut [u8; SECRET_MAX]) -> bool {
    if len >= SECRET_MAX {
        unsafe { bpf_probe_read_user_buf(src, dst) }.is_ok()
    } else {
        unsafe { bpf_probe_read_user_buf(src, &mut dst[..32]) }.is_ok()
    }
}
