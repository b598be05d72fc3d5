//! Which watched processes get the key-log uprobe, and where: each process's
//! executable is read once per binary (its Go symbol table), and the uprobe
//! is attached for that process only. A binary that is not Go, or has no
//! crypto/tls key-log function, is said once, with the reason.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use aya::programs::uprobe::UProbeLinkId;

use crate::sources::decrypt::gosym::{GoBinary, GoFunction};
use crate::sources::kernel::probes::Probes;

/// Go's key-log method, in crypto/tls and in its forks (utls, sagernet's
/// copies): each has its own `(*Config).writeKeyLog`.
pub const KEYLOG_SUFFIX: &str = ".(*Config).writeKeyLog";
/// The standard library's: servers use it.
pub const KEYLOG_FUNCTION: &str = "crypto/tls.(*Config).writeKeyLog";

pub use crate::core::event::DecryptProc as ProcProbe;

/// The key-log functions of one binary, or why there are none.
#[derive(Clone)]
struct Found {
    functions: Result<Vec<GoFunction>, String>,
    go_version: Option<String>,
}

#[derive(Default)]
pub struct Uprobes {
    /// Binaries read so far (by the path /proc/PID/exe names, plus its
    /// identity: a new build at the same path is read again).
    binaries: HashMap<(PathBuf, u64, u64), Found>,
    procs: HashMap<u32, (ProcProbe, Vec<UProbeLinkId>)>,
}

impl Uprobes {
    /// Attaches to new processes of `pids`, detaches from those gone; returns
    /// whether anything changed.
    pub fn sync(&mut self, probes: &mut Probes, pids: &HashSet<u32>) -> bool {
        let gone: Vec<u32> = self.procs.keys().filter(|p| !pids.contains(p)).copied().collect();
        let mut changed = !gone.is_empty();
        for pid in gone {
            if let Some((_, links)) = self.procs.remove(&pid) {
                for l in links {
                    probes.detach_keylog(l);
                }
            }
        }
        for &pid in pids {
            if self.procs.contains_key(&pid) {
                continue;
            }
            let entry = self.attach(probes, pid);
            self.procs.insert(pid, entry);
            changed = true;
        }
        changed
    }

    fn attach(&mut self, probes: &mut Probes, pid: u32) -> (ProcProbe, Vec<UProbeLinkId>) {
        let exe = PathBuf::from(format!("/proc/{pid}/exe"));
        let binary = std::fs::read_link(&exe).map(|p| p.display().to_string()).unwrap_or_else(|_| "?".into());
        let mut probe = ProcProbe { pid, binary, functions: Vec::new(), go_version: None, note: None };
        let id = match std::fs::metadata(&exe) {
            Ok(m) => {
                use std::os::unix::fs::MetadataExt as _;
                (PathBuf::from(&probe.binary), m.dev(), m.ino())
            }
            Err(e) => {
                probe.note = Some(format!("cannot read /proc/{pid}/exe: {e}"));
                return (probe, Vec::new());
            }
        };
        let found = self.binaries.entry(id).or_insert_with(|| read_binary(&exe)).clone();
        probe.go_version = found.go_version;
        let functions = match found.functions {
            Ok(f) => f,
            Err(why) => {
                probe.note = Some(why);
                return (probe, Vec::new());
            }
        };
        let mut links = Vec::new();
        let mut errors = Vec::new();
        for f in functions {
            match probes.attach_keylog(pid, &exe, f.file_offset) {
                Ok(l) => {
                    links.push(l);
                    probe.functions.push(f.name);
                }
                Err(e) => errors.push(format!("{}: {e}", f.name)),
            }
        }
        if !errors.is_empty() {
            probe.note = Some(errors.join("; "));
        }
        (probe, links)
    }

    /// Every watched process and what it got.
    pub fn procs(&self) -> Vec<ProcProbe> {
        let mut v: Vec<ProcProbe> = self.procs.values().map(|(p, _)| p.clone()).collect();
        v.sort_by_key(|p| p.pid);
        v
    }
}

/// The key-log functions of a binary: crypto/tls's first, then its forks.
fn read_binary(exe: &std::path::Path) -> Found {
    let bin = match GoBinary::open(exe) {
        Ok(b) => b,
        Err(e) => {
            return Found {
                functions: Err(format!("{e}: --decrypt reads secrets of Go servers only")),
                go_version: None,
            };
        }
    };
    let mut functions = bin.functions_ending(KEYLOG_SUFFIX);
    functions.sort_by_key(|f| (f.name != KEYLOG_FUNCTION, f.name.clone()));
    functions.dedup_by_key(|f| f.file_offset);
    let functions = if functions.is_empty() {
        Err(format!("no {KEYLOG_FUNCTION} in this Go binary (built without crypto/tls, or the function was inlined)"))
    } else {
        Ok(functions)
    };
    Found { functions, go_version: bin.go_version.clone() }
}
