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
    aya_build::build_ebpf(
        [Package { name: "hystall-ebpf", root_dir: root.as_str(), ..Default::default() }],
        Toolchain::default(),
    )
}
