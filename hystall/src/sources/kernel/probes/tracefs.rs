//! tracefs: mounting it when absent, and reading field offsets of classic
//! tracepoint records from their `format` files.

use std::path::{Path, PathBuf};

use super::ProbeError;

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// The tracefs root, mounting it at /sys/kernel/tracing if nothing is there.
pub fn ensure_mounted() -> Result<PathBuf, ProbeError> {
    for root in [TRACEFS, DEBUGFS_TRACING] {
        if Path::new(root).join("events").is_dir() {
            return Ok(PathBuf::from(root));
        }
        // Mounted but 0700 root (the default): mounting again would only fail with EPERM.
        if let Err(e) = std::fs::read_dir(root)
            && e.kind() == std::io::ErrorKind::PermissionDenied
        {
            return Err(ProbeError::Tracefs(format!(
                "tracefs at {root} is not readable: {e} (needs root or CAP_DAC_READ_SEARCH)"
            )));
        }
    }
    let target = std::ffi::CString::new(TRACEFS).expect("no NUL");
    let fstype = std::ffi::CString::new("tracefs").expect("no NUL");
    let src = std::ffi::CString::new("nodev").expect("no NUL");
    // SAFETY: plain mount(2) with valid C strings and no data.
    let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        return Err(ProbeError::Tracefs(format!(
            "tracefs is not mounted and mounting it at {TRACEFS} failed: {err} (try: mount -t tracefs nodev {TRACEFS})"
        )));
    }
    Ok(PathBuf::from(TRACEFS))
}

/// Offset of `field` in the record of tracepoint `category/name`.
pub fn field_offset(root: &Path, category: &str, name: &str, field: &str) -> Result<u32, ProbeError> {
    let path = root.join("events").join(category).join(name).join("format");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ProbeError::MissingTracepoint(format!("{category}/{name}"), e.to_string()))?;
    parse_offset(&text, field)
        .ok_or_else(|| ProbeError::MissingTracepoint(format!("{category}/{name}"), format!("no field {field}")))
}

/// Parses `field:TYPE NAME[N];\toffset:O;\tsize:S;` lines.
pub fn parse_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let line = line.trim();
        let decl = line.strip_prefix("field:")?.split(';').next()?;
        let last = decl.split_whitespace().last()?;
        let fname = last.split('[').next()?;
        if fname != field {
            return None;
        }
        let off = line.split(';').find_map(|p| p.trim().strip_prefix("offset:"))?;
        off.trim().parse().ok()
    })
}

/// Whether the tracepoint exists on this kernel.
pub fn exists(root: &Path, category: &str, name: &str) -> bool {
    root.join("events").join(category).join(name).is_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP_PROBE: &str = "name: tcp_probe\nID: 2273\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\n\tfield:__u8 saddr[28];\toffset:8;\tsize:28;\tsigned:0;\n\tfield:__u32 snd_una;\toffset:84;\tsize:4;\tsigned:0;\n\tfield:__u64 sock_cookie;\toffset:112;\tsize:8;\tsigned:0;\n\tfield:const void * skaddr;\toffset:128;\tsize:8;\tsigned:0;\n";

    #[test]
    fn parses_offsets_of_scalars_arrays_and_pointers() {
        assert_eq!(parse_offset(TCP_PROBE, "sock_cookie"), Some(112));
        assert_eq!(parse_offset(TCP_PROBE, "snd_una"), Some(84));
        assert_eq!(parse_offset(TCP_PROBE, "saddr"), Some(8));
        assert_eq!(parse_offset(TCP_PROBE, "skaddr"), Some(128));
        assert_eq!(parse_offset(TCP_PROBE, "snd_nxt"), None);
        assert_eq!(parse_offset("garbage\n\nfield:;offset:x;", "x"), None);
    }
}
