//! `hystall record FILE`: writes the run's timeline (every observation and
//! tick) in the recording format (core/recording.rs), bounded in size: past
//! `max_bytes` the file is rotated (FILE → FILE.1 → FILE.2 …, `keep` old parts)
//! and the new part starts with a snapshot of the live sockets, so each part
//! replays on its own.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::core::model::Model;
use crate::core::observation::{Observation, SockChange};
use crate::core::recording::{Header, write_header, write_step};
use crate::core::time::Mono;
use crate::core::timeline::Step;

pub struct Recorder {
    path: PathBuf,
    out: BufWriter<File>,
    header: Header,
    written: u64,
    max_bytes: u64,
    keep: u32,
    /// Total bytes over all parts (for the summary).
    pub total: u64,
    pub steps: u64,
    last_flush: Mono,
}

impl Recorder {
    pub fn create(path: &Path, header: Header, max_bytes: u64, keep: u32) -> Result<Recorder> {
        let (out, written) = open(path, &header)?;
        Ok(Recorder {
            path: path.to_owned(),
            out,
            header,
            written,
            max_bytes,
            keep,
            total: written,
            steps: 0,
            last_flush: Mono::ZERO,
        })
    }

    pub fn obs(&mut self, o: &Observation) -> Result<()> {
        self.step(&Step::Obs(o.clone()))
    }

    /// Records a tick; flushes once a second; rotates when the part is full.
    pub fn tick(&mut self, now: Mono, model: &Model) -> Result<()> {
        self.step(&Step::Tick(now))?;
        if now.since(self.last_flush) >= std::time::Duration::from_secs(1) {
            self.out.flush().context("writing the recording")?;
            self.last_flush = now;
        }
        if self.written >= self.max_bytes {
            self.rotate(now, model)?;
        }
        Ok(())
    }

    fn step(&mut self, s: &Step) -> Result<()> {
        let n = write_step(&mut self.out, s).context("writing the recording")?;
        self.written += n;
        self.total += n;
        self.steps += 1;
        Ok(())
    }

    fn rotate(&mut self, now: Mono, model: &Model) -> Result<()> {
        self.out.flush().context("writing the recording")?;
        for i in (1..self.keep).rev() {
            let from = part_path(&self.path, i);
            if from.exists() {
                std::fs::rename(&from, part_path(&self.path, i + 1)).context("rotating the recording")?;
            }
        }
        if self.keep > 0 {
            std::fs::rename(&self.path, part_path(&self.path, 1)).context("rotating the recording")?;
        }
        self.header.part += 1;
        let (out, written) = open(&self.path, &self.header)?;
        (self.out, self.written) = (out, written);
        self.total += written;
        // The new part starts with what the model knows of live sockets.
        for s in model.sockets.iter().filter(|s| s.closed.is_none()) {
            self.step(&Step::Obs(Observation::Sock { at: now, change: SockChange::Poll, sample: s.k.clone() }))?;
            if let Some(d) = &s.diag {
                self.step(&Step::Obs(Observation::Diag { at: s.diag_at.unwrap_or(now), sample: d.clone() }))?;
            }
        }
        let ports: Vec<(u16, u32)> = model.owners.iter().map(|(p, o)| (*p, *o)).collect();
        self.step(&Step::Obs(Observation::Owners { at: now, ports }))?;
        Ok(())
    }

    pub fn finish(mut self) -> Result<u64> {
        self.out.flush().context("writing the recording")?;
        Ok(self.total)
    }
}

/// FILE.N
pub fn part_path(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

fn open(path: &Path, header: &Header) -> Result<(BufWriter<File>, u64)> {
    let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::with_capacity(256 << 10, f);
    let n = write_header(&mut out, header).context("writing the recording")?;
    Ok((out, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::recording::Reader;
    use crate::core::timeline::ModelOptions;

    #[test]
    fn rotation_keeps_bounded_parts_that_each_replay() {
        let dir = std::env::temp_dir().join(format!("hystall-rec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.hrec");
        let options = ModelOptions {
            stall_timeout_ms: 3000,
            quic_idle_ms: 30_000,
            stream_window: 8 << 20,
            conn_window: 20 << 20,
        };
        let header = Header {
            hystall_version: "t".into(),
            node: "n".into(),
            wall_offset_ns: 0,
            options: options.clone(),
            pids: vec![],
            comms: vec![],
            cgroups: vec![],
            part: 0,
        };
        let model = options.model();
        let mut rec = Recorder::create(&path, header, 4096, 2).unwrap();
        for i in 0..2000u64 {
            rec.tick(Mono(i * 200_000_000), &model).unwrap();
        }
        rec.finish().unwrap();
        let sizes: Vec<u64> = [path.clone(), part_path(&path, 1), part_path(&path, 2)]
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .collect();
        assert!(sizes.iter().all(|&s| s < 4096 + 64), "{sizes:?}");
        assert!(!part_path(&path, 3).exists());
        let newest = Reader::new(File::open(&path).unwrap()).unwrap();
        let older = Reader::new(File::open(part_path(&path, 1)).unwrap()).unwrap();
        assert!(newest.header.part > older.header.part);
        assert!(newest.filter_map(Result::ok).count() > 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
