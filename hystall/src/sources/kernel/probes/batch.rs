//! Whole-map reads in batches (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6+): a few
//! thousand entries per syscall, where aya's iterator costs two syscalls per
//! entry (next key, then lookup) — 1.8 s for a full 65,536-flow map here,
//! against a few milliseconds batched. aya 0.14 has no batch operations; this
//! is the one command, on the map's own fd.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::Pod;
use aya::maps::Map;

/// `BPF_MAP_LOOKUP_BATCH` from `enum bpf_cmd`.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries asked for per call (a hash bucket larger than this would need a
/// retry with more: ENOSPC).
const CHUNK: usize = 4096;

/// The `batch` member of `union bpf_attr` (the kernel zero-fills the rest of
/// the union when told the shorter size).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Runs batch command `cmd` with `attr`; the kernel writes back how many
/// entries it handled in `attr.count`, also on error.
///
/// # Safety
/// Every pointer in `attr` must point at a buffer of `count` keys or values
/// of the map's sizes (or at a position token), alive for the call.
unsafe fn batch_call(cmd: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: the caller's promise on `attr`; its size is the union member's.
    let ret =
        unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut BatchAttr, size_of::<BatchAttr>() as libc::c_uint) };
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Every (key, value) of a hash map (plain, not per-CPU), in batches; an
/// `Unsupported` error on kernels without the command (the caller falls back
/// to the iterator).
pub fn read_all<K: Pod + Default, V: Pod + Default>(map: &Map) -> io::Result<Vec<(K, V)>> {
    let mut out = Vec::new();
    for_each(map, |k, v| out.push((k, v)))?;
    Ok(out)
}

/// Hands every (key, value) of a hash map to `f`, a batch at a time, and
/// returns how many: a whole read of a node's flow map without a copy of it
/// (20,000 flows are ~6 MiB, and the peaks showed in the RSS). An
/// `Unsupported` error comes before any entry.
pub fn for_each<K: Pod + Default, V: Pod + Default>(map: &Map, mut f: impl FnMut(K, V)) -> io::Result<usize> {
    let data = match map {
        Map::HashMap(d) | Map::LruHashMap(d) => d,
        _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a hash map")),
    };
    let fd = data.fd().as_fd().as_raw_fd();
    let mut seen = 0;
    let mut keys = vec![K::default(); CHUNK];
    let mut values = vec![V::default(); CHUNK];
    // The position token of a hash map's batch walk is a bucket index (u32).
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut first = true;
    let mut chunk = CHUNK;
    loop {
        if keys.len() < chunk {
            keys.resize(chunk, K::default());
            values.resize(chunk, V::default());
        }
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &raw const token_in as u64 },
            out_batch: &raw mut token_out as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd as u32,
            ..Default::default()
        };
        // SAFETY: the attr points at buffers of `count` keys and values of
        // the map's sizes (Pod types of the map's key and value), and at the
        // two tokens; all outlive the call.
        let err = unsafe { batch_call(BPF_MAP_LOOKUP_BATCH, &mut attr) }.err();
        let got = attr.count as usize;
        for (k, v) in keys[..got].iter().zip(&values[..got]) {
            f(*k, *v);
        }
        seen += got;
        match err.as_ref().and_then(io::Error::raw_os_error) {
            None => {}
            // The walk is over (the last entries came with it).
            Some(libc::ENOENT) => return Ok(seen),
            // One bucket holds more than we asked for: ask for more.
            Some(libc::ENOSPC) if got == 0 && chunk < 1 << 20 => {
                chunk *= 2;
                continue;
            }
            // Not implemented for this map type or kernel (524: ENOTSUPP).
            Some(libc::EINVAL | libc::EOPNOTSUPP | 524) => {
                return Err(io::Error::new(io::ErrorKind::Unsupported, "BPF_MAP_LOOKUP_BATCH"));
            }
            Some(_) => return Err(err.unwrap_or_else(io::Error::last_os_error)),
        }
        token_in = token_out;
        first = false;
    }
}

/// `BPF_MAP_UPDATE_BATCH` from `enum bpf_cmd`.
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// The fd of an array map.
fn array_fd(map: &Map) -> io::Result<i32> {
    match map {
        Map::Array(d) => Ok(d.fd().as_fd().as_raw_fd()),
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "not an array")),
    }
}

/// Writes `values` into slots 0..len of an array map, in one call.
pub fn set_array<V: Pod>(map: &Map, values: &[V]) -> io::Result<()> {
    let fd = array_fd(map)?;
    let keys: Vec<u32> = (0..values.len() as u32).collect();
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: values.len() as u32,
        map_fd: fd as u32,
        ..Default::default()
    };
    // SAFETY: `count` keys (u32 slots) and values of the map's value type,
    // both alive for the call; the kernel only reads them.
    unsafe { batch_call(BPF_MAP_UPDATE_BATCH, &mut attr) }?;
    if attr.count as usize != values.len() {
        return Err(io::Error::other(format!("{} of {} slots written", attr.count, values.len())));
    }
    Ok(())
}

/// Reads slots 0..n of an array map, in one call.
pub fn get_array<V: Pod + Default>(map: &Map, n: usize) -> io::Result<Vec<V>> {
    let fd = array_fd(map)?;
    let mut keys = vec![0u32; n];
    let mut values = vec![V::default(); n];
    let mut token_out = 0u32;
    let mut attr = BatchAttr {
        out_batch: &raw mut token_out as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: n as u32,
        map_fd: fd as u32,
        ..Default::default()
    };
    // SAFETY: buffers of `count` keys and values of the map's sizes and the
    // position token, all alive for the call.
    match unsafe { batch_call(BPF_MAP_LOOKUP_BATCH, &mut attr) } {
        // ENOENT: the walk reached the array's end with what was asked.
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e),
        _ => {}
    }
    if attr.count as usize != n || keys.iter().enumerate().any(|(i, k)| *k as usize != i) {
        return Err(io::Error::other(format!("{} of {n} slots read", attr.count)));
    }
    Ok(values)
}
