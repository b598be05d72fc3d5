//! `--replay FILE`: a recording (`hystall record`) as a timeline to play back
//! through the model. (Captures are turned into timelines by `offline`.)

use std::cell::RefCell;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::rc::Rc;

use anyhow::{Context as _, Result};

use crate::core::recording::{Header, Reader, RecordingError};
use crate::core::timeline::Step;

/// An opened recording: its header and its steps. A read error mid-file ends
/// the steps and is kept in `error` (the caller reports it after the replay).
pub struct Recording {
    pub header: Header,
    pub steps: Box<dyn Iterator<Item = Step>>,
    pub error: Rc<RefCell<Option<RecordingError>>>,
    pub truncated: Rc<RefCell<bool>>,
}

pub fn open_recording(path: &Path) -> Result<Recording> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let reader = Reader::new(BufReader::with_capacity(256 << 10, f)).with_context(|| path.display().to_string())?;
    let header = reader.header.clone();
    let error = Rc::new(RefCell::new(None));
    let truncated = Rc::new(RefCell::new(false));
    let steps = Steps { reader, error: error.clone(), truncated: truncated.clone() };
    Ok(Recording { header, steps: Box::new(steps), error, truncated })
}

/// Whether the file starts like a recording (otherwise it may be a capture).
pub fn is_recording(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| &magic == crate::core::recording::MAGIC)
}

struct Steps {
    reader: Reader<BufReader<File>>,
    error: Rc<RefCell<Option<RecordingError>>>,
    truncated: Rc<RefCell<bool>>,
}

impl Iterator for Steps {
    type Item = Step;
    fn next(&mut self) -> Option<Step> {
        match self.reader.next_step() {
            Ok(Some(s)) => Some(s),
            Ok(None) => {
                *self.truncated.borrow_mut() = self.reader.truncated;
                None
            }
            Err(e) => {
                *self.error.borrow_mut() = Some(e);
                None
            }
        }
    }
}
