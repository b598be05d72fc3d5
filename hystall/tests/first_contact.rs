//! Root tests of what a newcomer sees on first contact: a selection that
//! matches nothing yet is said in `watch_started`, and a second enforcing
//! hystall is a one-line error (a second observer only a warning).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Proc, bin, root_or_skip};

#[test]
fn a_selection_that_matches_nothing_yet_is_said() {
    let Some(_g) = root_or_skip("a_selection_that_matches_nothing_yet_is_said") else { return };
    let mut w = Proc::spawn(&["watch", "--json", "--comm", "hystall-no-such", "--duration", "2"]);
    let started = w.wait_event("watch_started", Duration::from_secs(15));
    let warnings: Vec<&str> =
        started["warnings"].as_array().expect("warnings").iter().filter_map(|w| w.as_str()).collect();
    assert!(warnings.iter().any(|w| w.contains("no process matches the selection yet")), "{started}");
}

#[test]
fn a_second_enforcing_hystall_is_a_one_line_error_and_a_second_observer_a_warning() {
    let test = "a_second_enforcing_hystall_is_a_one_line_error_and_a_second_observer_a_warning";
    let Some(_g) = root_or_skip(test) else { return };
    let mut sleeper = Command::new("sleep").arg("60").spawn().expect("sleep");
    let pid = sleeper.id().to_string();
    let mut first = Proc::spawn(&["watch", "--json", "--pid", &pid, "--enforce"]);
    first.wait_event("watch_started", Duration::from_secs(15));

    let second = Command::new(bin())
        .args(["watch", "--json", "--pid", &pid, "--enforce", "--duration", "1"])
        .stdout(Stdio::null())
        .output()
        .expect("second hystall");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "refused: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("already attached") && err.contains(&first.pid().to_string()), "{err}");

    // An observer beside it runs, and says so.
    let mut observer = Proc::spawn(&["watch", "--json", "--pid", &pid, "--duration", "1"]);
    let started = observer.wait_event("watch_started", Duration::from_secs(15));
    assert!(started["warnings"][0].as_str().is_some_and(|w| w.contains("already attached")), "{started}");
    assert_eq!(observer.child.wait().expect("observer ends").code(), Some(0));
    first.stop();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}
