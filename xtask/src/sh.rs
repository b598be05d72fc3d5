//! Small process helpers shared by the tasks: where things are, who we are, and
//! running commands while printing them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

/// The workspace root (the folder above `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// Cargo's target folder (honours `CARGO_TARGET_DIR`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() { dir } else { workspace_root().join(dir) }
        }
        _ => workspace_root().join("target"),
    }
}

/// The release binary `cargo xtask build` makes.
pub fn release_binary() -> PathBuf {
    target_dir().join("release").join("hystall")
}

/// A `cargo` command run from the workspace root, with the same cargo that runs us.
pub fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root());
    cmd
}

/// `$CARGO_HOME/bin`, by default `~/.cargo/bin`.
pub fn cargo_bin_dir() -> Option<PathBuf> {
    match std::env::var_os("CARGO_HOME") {
        Some(home) if !home.is_empty() => Some(PathBuf::from(home).join("bin")),
        _ => std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo").join("bin")),
    }
}

/// Puts `~/.cargo/bin` on PATH (for us and every child: cargo finds bpf-linker there).
pub fn prepare_path() {
    let Some(bin) = cargo_bin_dir().filter(|b| b.is_dir()) else {
        return;
    };
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|p| p == bin) {
        return;
    }
    let mut dirs = vec![bin];
    dirs.extend(std::env::split_paths(&path));
    if let Ok(joined) = std::env::join_paths(dirs) {
        set_env("PATH", joined);
    }
}

/// Sets a variable for us and for every command we start afterwards.
pub fn set_env(key: &str, value: impl Into<OsString>) {
    // SAFETY: xtask is single-threaded: no other thread reads the environment.
    unsafe { std::env::set_var(key, value.into()) }
}

/// The first executable called `name` on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| is_executable(p))
}

pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// Are we root?
pub fn is_root() -> bool {
    // geteuid(2) cannot fail and has no preconditions; declared here to avoid a libc
    // dependency.
    unsafe extern "C" {
        safe fn geteuid() -> u32;
    }
    geteuid() == 0
}

/// A command run as root: directly when we are root, through `sudo` when it is
/// available, `None` otherwise (the caller then says what to run).
pub fn as_root(program: &str) -> Option<Command> {
    if is_root() {
        Some(Command::new(program))
    } else if which("sudo").is_some() {
        let mut cmd = Command::new("sudo");
        cmd.arg(program);
        Some(cmd)
    } else {
        None
    }
}

/// The command line as one would type it.
pub fn display(cmd: &Command) -> String {
    let mut line: Vec<String> =
        cmd.get_envs().filter_map(|(k, v)| Some(format!("{}={}", k.to_string_lossy(), v?.to_string_lossy()))).collect();
    line.push(cmd.get_program().to_string_lossy().into_owned());
    line.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    line.join(" ")
}

/// Prints the command, runs it with inherited stdio, fails if it fails.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let line = display(cmd);
    println!("$ {line}");
    let status = cmd.status().with_context(|| format!("cannot start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs a check silently: its stdout when it succeeds, `None` otherwise.
pub fn probe(cmd: &mut Command) -> Option<String> {
    let out = cmd.stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
