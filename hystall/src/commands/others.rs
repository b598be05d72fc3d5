//! Other hystall monitors on this host (`watch`, `top`, `record` of another
//! user or a systemd service): they work side by side, each with its own
//! programs and maps, but two enforcers would act on the same sockets.

/// Subcommands that attach probes.
const MONITORS: &[&str] = &["watch", "top", "record"];

/// Other running hystall monitors (not us, not our parent or children): pid,
/// and whether it enforces for real (`--enforce` without `--dry-run`).
pub fn running() -> Vec<(u32, bool)> {
    let me = std::process::id();
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out: Vec<(u32, bool)> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && ppid(pid) != Some(me) && ppid(me) != Some(pid))
        .filter_map(|pid| Some((pid, monitor_args(pid)?)))
        .map(|(pid, args)| (pid, args.iter().any(|a| a == "--enforce") && !args.iter().any(|a| a == "--dry-run")))
        .collect();
    out.sort_unstable();
    out
}

/// The arguments of `pid` when it is a hystall monitor.
fn monitor_args(pid: u32) -> Option<Vec<String>> {
    if crate::sources::processes::procs::comm_of(pid).as_deref() != Some("hystall") {
        return None;
    }
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> =
        cmd.split(|b| *b == 0).skip(1).filter_map(|a| std::str::from_utf8(a).ok()).map(str::to_owned).collect();
    // The first argument that is not an option is the subcommand.
    let sub = args.iter().find(|a| !a.starts_with('-'))?;
    MONITORS.contains(&sub.as_str()).then_some(args)
}

fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces and parentheses).
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// The warning for `watch`/`top` when others run; an error when this run and
/// another one both enforce for real (`enforce`: --enforce without --dry-run).
pub fn check(enforce: bool) -> anyhow::Result<Option<String>> {
    let others = running();
    if others.is_empty() {
        return Ok(None);
    }
    let list: Vec<String> = others.iter().map(|(p, _)| p.to_string()).collect();
    if enforce && let Some((pid, _)) = others.iter().find(|(_, e)| *e) {
        anyhow::bail!(
            "another hystall is already attached and enforcing (pid {pid}): two --enforce runs would act on the same sockets; stop it, or run this one with --dry-run or without --enforce"
        );
    }
    Ok(Some(format!(
        "another hystall is already attached (pid {}): both see the same traffic, each with its own probes",
        list.join(", ")
    )))
}
