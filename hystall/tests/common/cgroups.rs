//! Cgroup v2 directories for tests (`--cgroup`, `--unit`), removed afterwards.

use std::path::{Path, PathBuf};

use hystall::sources::processes::cgroup::cgroup2_mount;

/// Cgroup directories this test created (deepest last), removed on drop after
/// their processes are moved back to the root.
pub struct Cgroups {
    mount: PathBuf,
    created: Vec<PathBuf>,
}

impl Cgroups {
    pub fn new() -> Cgroups {
        Cgroups { mount: cgroup2_mount().expect("a cgroup2 mount"), created: Vec::new() }
    }

    /// Creates `rel` (and its missing parents) under the mount.
    pub fn create(&mut self, rel: &str) -> PathBuf {
        let mut dir = self.mount.clone();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            dir.push(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
                self.created.push(dir.clone());
            }
        }
        dir
    }

    pub fn enter(dir: &Path, pid: u32) {
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).expect("moving a process into the cgroup");
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for dir in self.created.iter().rev() {
            for pid in std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default().lines() {
                let _ = std::fs::write(self.mount.join("cgroup.procs"), pid);
            }
            let _ = std::fs::remove_dir(dir);
        }
    }
}
