//! Functions of a Go binary, found by name in its pc-line table (`.gopclntab`):
//! where a uprobe on e.g. `crypto/tls.(*Config).writeKeyLog` goes. Stripped Go
//! binaries have no `.symtab`, but they keep this table, because the Go runtime
//! needs it for stack traces.
//!
//! The layout is Go's own (src/debug/gosym/pcln.go, src/runtime/symtab.go), for
//! Go 1.16 and newer. Every read is bounds-checked, and the table is checked
//! for consistency as it is read (each `_func` repeats its function table entry,
//! entries ascend, every function lies in an executable segment): a uprobe at a
//! wrong offset would corrupt the traced process, so a table we do not
//! understand is an error, never a guess.

use std::path::{Path, PathBuf};

use object::{Object as _, ObjectSection as _, ObjectSegment as _};

/// Go 1.16–1.17: entries are absolute addresses (uintptr).
const GO116_MAGIC: u32 = 0xffff_fffa;
/// Go 1.18–1.19: entries are u32 offsets from the header's textStart.
const GO118_MAGIC: u32 = 0xffff_fff0;
/// Go 1.20 and newer: the 1.18 layout.
const GO120_MAGIC: u32 = 0xffff_fff1;

/// One function of a Go binary, where a uprobe goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoFunction {
    pub name: String,
    pub vaddr: u64,
    /// In the file: what a uprobe is attached at.
    pub file_offset: u64,
}

/// What a Go binary is (for messages): its Go version from .go.buildinfo when readable.
#[derive(Debug)]
pub struct GoBinary {
    pub path: PathBuf,
    pub go_version: Option<String>,
    /// Every function of the table, in table (address) order.
    functions: Vec<GoFunction>,
}

#[derive(Debug, thiserror::Error)]
pub enum GoSymError {
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{} is not an ELF file", .0.display())]
    NotElf(PathBuf),
    #[error("{} is not a Go binary (no .gopclntab section)", .0.display())]
    NotGo(PathBuf),
    /// A Go binary whose table has no section of its own (e.g. an externally
    /// linked PIE build, where it sits inside .data.rel.ro and is only found
    /// through runtime.pclntab).
    #[error(
        "{} is a Go binary ({}) without a .gopclntab section; finding its table through runtime.pclntab is not supported",
        path.display(), go_version.as_deref().unwrap_or("unknown version")
    )]
    NoTable { path: PathBuf, go_version: Option<String> },
    #[error("{}: unsupported Go symbol table (.gopclntab magic {magic:#010x}; Go 1.16 or newer is needed)", path.display())]
    Unsupported { path: PathBuf, magic: u32 },
    #[error("{} is malformed: {what}", path.display())]
    Malformed { path: PathBuf, what: String },
    #[error("{} has no function {name} in its Go symbol table", path.display())]
    Missing { path: PathBuf, name: String },
}

impl GoBinary {
    pub fn open(path: &Path) -> Result<GoBinary, GoSymError> {
        // Go binaries are tens of MB: read once, keep only the function list.
        let data = std::fs::read(path).map_err(|source| GoSymError::Io { path: path.to_owned(), source })?;
        GoBinary::parse(path, &data)
    }

    /// The function whose full name is `name`.
    pub fn function(&self, name: &str) -> Result<GoFunction, GoSymError> {
        self.functions
            .iter()
            .find(|f| f.name == name)
            .cloned()
            .ok_or_else(|| GoSymError::Missing { path: self.path.clone(), name: name.to_owned() })
    }

    /// Every function whose name ends with `suffix` (e.g. ".(*Config).writeKeyLog":
    /// forks of crypto/tls such as github.com/sagernet/... or utls also have one).
    pub fn functions_ending(&self, suffix: &str) -> Vec<GoFunction> {
        self.functions.iter().filter(|f| f.name.ends_with(suffix)).cloned().collect()
    }

    /// Every function, in address order.
    pub fn functions(&self) -> &[GoFunction] {
        &self.functions
    }

    fn parse(path: &Path, data: &[u8]) -> Result<GoBinary, GoSymError> {
        let malformed = |what: String| GoSymError::Malformed { path: path.to_owned(), what };
        if !matches!(object::FileKind::parse(data), Ok(object::FileKind::Elf32 | object::FileKind::Elf64)) {
            return Err(GoSymError::NotElf(path.to_owned()));
        }
        let elf = object::File::parse(data).map_err(|e| malformed(format!("bad ELF headers ({e})")))?;
        // Unreadable section names (a truncated file) would look like "no .gopclntab".
        if elf.sections().any(|s| s.name_bytes().is_err()) {
            return Err(malformed("its section names are outside the file".into()));
        }
        let go_version = go_version(&elf);
        // Internally linked PIE builds name the section .data.rel.ro.gopclntab.
        let Some(section) = [".gopclntab", ".data.rel.ro.gopclntab"].iter().find_map(|n| elf.section_by_name(n)) else {
            return Err(match elf.section_by_name(".go.buildinfo") {
                Some(_) => GoSymError::NoTable { path: path.to_owned(), go_version },
                None => GoSymError::NotGo(path.to_owned()),
            });
        };
        let table = section.data().map_err(|e| malformed(format!(".gopclntab is outside the file ({e})")))?;
        let text = elf.section_by_name(".text").map(|s| s.address());
        let entries = parse_table(table, text).map_err(|e| match e {
            TableError::Unsupported(magic) => GoSymError::Unsupported { path: path.to_owned(), magic },
            TableError::Malformed(what) => malformed(format!(".gopclntab: {what}")),
        })?;

        // Executable PT_LOAD segments: (vaddr, file offset, file size).
        let code: Vec<(u64, u64, u64)> = elf
            .segments()
            .filter(|s| matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
            .map(|s| {
                let (offset, size) = s.file_range();
                (s.address(), offset, size)
            })
            .collect();
        let file_offset = |vaddr: u64| {
            code.iter().find_map(|&(start, offset, size)| {
                vaddr.checked_sub(start).filter(|&d| d < size).and_then(|d| offset.checked_add(d))
            })
        };
        let functions = entries
            .into_iter()
            .map(|(name, vaddr)| match file_offset(vaddr) {
                Some(file_offset) => Ok(GoFunction { name, vaddr, file_offset }),
                None => Err(malformed(format!("function {name} at {vaddr:#x} is in no executable segment"))),
            })
            .collect::<Result<_, _>>()?;
        Ok(GoBinary { path: path.to_owned(), go_version, functions })
    }
}

/// Why a table could not be read (the caller adds the path).
#[derive(Debug)]
enum TableError {
    Unsupported(u32),
    Malformed(String),
}

/// The functions (name, entry vaddr) of a Go 1.16+ pc-line table, in table
/// order. `text_section` is the address of .text, for 1.18+ tables whose
/// textStart is 0 (recent Go writes 0 there; PIE builds leave it to a relocation).
fn parse_table(data: &[u8], text_section: Option<u64>) -> Result<Vec<(String, u64)>, TableError> {
    let bad = |what: String| TableError::Malformed(what);
    let le = Reader { data, big_endian: false }.uint(0, 4).ok_or_else(|| bad("shorter than its header".into()))? as u32;
    let known = |m: u32| matches!(m, GO116_MAGIC | GO118_MAGIC | GO120_MAGIC);
    // The table is in the target's byte order.
    let (magic, big_endian) = match (known(le), known(le.swap_bytes())) {
        (true, _) => (le, false),
        (false, true) => (le.swap_bytes(), true),
        (false, false) => return Err(TableError::Unsupported(le)),
    };
    let r = Reader { data, big_endian };

    // magic, 2 pad bytes, min instruction size, pointer size, then pointer-sized words.
    let [pad1, pad2, min_lc, ptr] = data
        .get(4..8)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .ok_or_else(|| bad("shorter than its header".into()))?;
    if pad1 != 0 || pad2 != 0 || !matches!(min_lc, 1 | 2 | 4) || !matches!(ptr, 4 | 8) {
        return Err(bad(format!("bad header (pad {pad1} {pad2}, instruction size {min_lc}, pointer size {ptr})")));
    }
    let word = |i: u64| r.uint(8 + i * u64::from(ptr), ptr).ok_or_else(|| bad("shorter than its header".into()));
    let go118 = magic != GO116_MAGIC;
    let nfunc = word(0)?;
    let (text_start, funcnames, pcln) = if go118 { (word(2)?, word(3)?, word(7)?) } else { (0, word(2)?, word(6)?) };
    let text_start = match (go118, text_start, text_section) {
        (true, 0, Some(text)) => text,
        (true, 0, None) => return Err(bad("textStart is 0 and there is no .text section".into())),
        (_, start, _) => start,
    };

    // The function table: nfunc (entry, funcoff) pairs and the end address;
    // u32 fields in 1.18+, pointer-sized in 1.16.
    let field = if go118 { 4 } else { ptr };
    let fsize = u64::from(field);
    let functab_len = nfunc.checked_mul(2).and_then(|n| n.checked_add(1)).and_then(|n| n.checked_mul(fsize));
    if functab_len.and_then(|len| r.bytes(pcln, len)).is_none() {
        return Err(bad(format!(
            "its function table ({nfunc} functions at {pcln:#x}) runs past its end ({:#x} bytes)",
            data.len()
        )));
    }
    // Bounded by the check above: nfunc is less than the table's size.
    let mut functions = Vec::with_capacity(nfunc as usize);
    let mut previous = 0;
    for i in 0..nfunc {
        let at = pcln + 2 * i * fsize; // inside the table, checked above
        let outside = |what: &str| bad(format!("function {i}: its {what} is outside the table"));
        let entry_field = r.uint(at, field).ok_or_else(|| outside("entry"))?;
        let funcoff = r.uint(at + fsize, field).ok_or_else(|| outside("entry"))?;
        // The _func record: the entry again (same encoding), then nameOff (i32).
        let func = pcln.checked_add(funcoff).ok_or_else(|| outside("record"))?;
        let func_entry = r.uint(func, field).ok_or_else(|| outside("record"))?;
        let name_off = r.uint(func + fsize, 4).ok_or_else(|| outside("record"))?;
        if func_entry != entry_field {
            return Err(bad(format!(
                "function {i}: its record says entry {func_entry:#x}, the function table {entry_field:#x}"
            )));
        }
        let entry = if go118 { text_start.checked_add(entry_field) } else { Some(entry_field) };
        let entry = entry.filter(|&e| e >= previous).ok_or_else(|| bad(format!("function {i} is out of order")))?;
        previous = entry;
        // nameOff is an i32: a negative one is garbage.
        let name = Some(name_off)
            .filter(|&o| o <= i32::MAX as u64)
            .and_then(|o| funcnames.checked_add(o))
            .and_then(|o| r.cstr(o))
            .ok_or_else(|| outside("name"))?;
        functions.push((String::from_utf8_lossy(name).into_owned(), entry));
    }
    Ok(functions)
}

/// Bounds-checked reads from a table in either byte order.
#[derive(Clone, Copy)]
struct Reader<'a> {
    data: &'a [u8],
    big_endian: bool,
}

impl<'a> Reader<'a> {
    fn bytes(&self, offset: u64, len: u64) -> Option<&'a [u8]> {
        let start = usize::try_from(offset).ok()?;
        self.data.get(start..start.checked_add(usize::try_from(len).ok()?)?)
    }

    /// An unsigned integer of `size` (at most 8) bytes.
    fn uint(&self, offset: u64, size: u8) -> Option<u64> {
        let bytes = self.bytes(offset, u64::from(size.min(8)))?;
        let be = |v: u64, &b: &u8| v << 8 | u64::from(b);
        Some(if self.big_endian { bytes.iter().fold(0, be) } else { bytes.iter().rev().fold(0, be) })
    }

    /// The NUL-terminated string at `offset`, without its NUL.
    fn cstr(&self, offset: u64) -> Option<&'a [u8]> {
        let rest = self.data.get(usize::try_from(offset).ok()?..)?;
        rest.get(..rest.iter().position(|&b| b == 0)?)
    }
}

/// The Go version in .go.buildinfo (what `go version FILE` prints), best effort.
fn go_version(elf: &object::File) -> Option<String> {
    let data = elf.section_by_name(".go.buildinfo")?.data().ok()?;
    // 32 bytes: magic (14), pointer size, flags, then two pointers or padding.
    let &[ptr, flags] = data.strip_prefix(b"\xff Go buildinf:")?.get(..2)? else { return None };
    let version = if flags & 2 != 0 {
        // Go 1.18+: the version inline at 32, after its uvarint length.
        let rest = data.get(32..)?;
        let (len, n) = uvarint(rest)?;
        Reader { data: rest, big_endian: false }.bytes(n as u64, len)?
    } else {
        // Before: a pointer at 16 to a Go string {data pointer, length}.
        if !matches!(ptr, 4 | 8) {
            return None;
        }
        let r = Reader { data, big_endian: flags & 1 != 0 };
        let string = Reader { data: vaddr_bytes(elf, r.uint(16, ptr)?, 2 * u64::from(ptr))?, ..r };
        vaddr_bytes(elf, string.uint(0, ptr)?, string.uint(u64::from(ptr), ptr)?)?
    };
    std::str::from_utf8(version).ok().filter(|v| !v.is_empty()).map(str::to_owned)
}

/// `len` bytes at `vaddr`, from the file data of the segment holding them.
fn vaddr_bytes<'a>(elf: &object::File<'a>, vaddr: u64, len: u64) -> Option<&'a [u8]> {
    elf.segments().find_map(|s| s.data_range(vaddr, len).ok().flatten())
}

/// Go's encoding/binary.Uvarint: the value and how many bytes it took.
fn uvarint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests;
