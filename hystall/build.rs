//! Builds the kernel programs (`hystall-ebpf`) for the BPF target with the nightly
//! toolchain and bpf-linker, so that `include_bytes_aligned!` can embed them.
//! `cargo xtask setup` installs what this needs.
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let meta = cargo_metadata::MetadataCommand::new().no_deps().exec().context("cargo metadata")?;
    let ebpf = meta
        .packages
        .iter()
        .find(|p| p.name.as_str() == "hystall-ebpf")
        .ok_or_else(|| anyhow!("hystall-ebpf not found in the workspace"))?;
    let root = ebpf.manifest_path.parent().ok_or_else(|| anyhow!("hystall-ebpf has no folder"))?;
    // aya-build turns every stderr line of its inner cargo into a `cargo:warning`,
    // so its progress ("Compiling core ...") filled the screen as warnings on every
    // build. Quiet, that cargo prints only real diagnostics (and errors), which
    // still come through.
    // SAFETY: a build script is single-threaded here; nothing reads the
    // environment concurrently.
    unsafe { std::env::set_var("CARGO_TERM_QUIET", "true") };
    aya_build::build_ebpf(
        [Package { name: "hystall-ebpf", root_dir: root.as_str(), ..Default::default() }],
        Toolchain::default(),
    )
}
