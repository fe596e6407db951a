//! `cloakfs info`: show what a volume is made of, without any secret.

use crate::failure::Result;
use clap::Args;
use cloakfs_core::format::config::{config_path, VolumeConfig, FORMAT_VERSION};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The volume's cipher directory (or its config file).
    pub cipherdir: PathBuf,
}

pub fn run(args: InfoArgs) -> Result<()> {
    let c = VolumeConfig::load(&args.cipherdir)?;
    let p = &c.params;
    println!(
        "config:          {}",
        config_path(&args.cipherdir).display()
    );
    println!("format version:  {FORMAT_VERSION}");
    println!("content cipher:  {}", p.content.name());
    println!("name cipher:     aes-256-siv");
    println!("block size:      {} bytes", p.block_size);
    println!(
        "holes:           {}",
        if p.strict_holes { "strict" } else { "sparse" }
    );
    println!("long name max:   {}", p.long_name_max);
    if let Some(k) = crate::commands::slots::describe_key_source(&c) {
        println!("key source:      {k}");
    }
    println!("key slots:       {}", c.slots().len());
    for s in c.slots() {
        println!("  {}", crate::commands::slots::describe(s));
    }
    Ok(())
}
