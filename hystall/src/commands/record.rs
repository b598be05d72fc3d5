//! `hystall record FILE`: `watch`, with the run saved for `--replay`.

use anyhow::Result;

use super::watch::{RecordTo, run_live};
use crate::cli::{EnforceArgs, RecordArgs, WatchArgs};

pub async fn run(args: RecordArgs) -> Result<()> {
    anyhow::ensure!(args.max_size >= 1, "--max-size must be at least 1 MiB");
    let to = RecordTo { path: &args.file, max_bytes: args.max_size << 20, keep: args.keep };
    let watch = WatchArgs {
        select: args.select.clone(),
        lab: args.lab.clone(),
        enforce: EnforceArgs::default(),
        json: args.json,
        duration: args.duration,
        replay: Default::default(),
        metrics: None,
    };
    run_live(watch, Some(to)).await
}
