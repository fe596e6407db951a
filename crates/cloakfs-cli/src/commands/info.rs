//! `cloakfs info`: show what a volume is made of, without any secret.

use crate::failure::Result;
use clap::Args;
use cloakfs_core::format::config::{config_path, FileKeys, VolumeConfig, FORMAT_VERSION};
use cloakfs_core::known_volumes::KnownVolumes;
use cloakfs_core::text::b64;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Print one JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
    /// The volume's cipher directory (or its config file).
    pub cipherdir: PathBuf,
}

pub fn run(args: InfoArgs) -> Result<()> {
    let c = VolumeConfig::load(&args.cipherdir)?;
    if args.json {
        println!("{}", as_json(&args.cipherdir, &c));
        return Ok(());
    }
    let p = &c.params;
    println!(
        "config:          {}",
        config_path(&args.cipherdir).display()
    );
    println!("volume ID:       {}", b64(&p.volume_id));
    println!("format version:  {FORMAT_VERSION}");
    println!("content cipher:  {}", p.content.name());
    if let Some(w) = p.content.integrity_warning() {
        println!("integrity:       none: {w}");
    }
    println!("name cipher:     aes-256-siv");
    println!("block size:      {} bytes", p.block_size);
    println!(
        "holes:           {}",
        if p.strict_holes { "strict" } else { "sparse" }
    );
    println!("long name max:   {}", p.long_name_max);
    if p.file_keys == FileKeys::Wrapped {
        println!(
            "file keys:       per file, wrapped to recipients (a sharing volume); headers {}",
            if p.shared_header_mac {
                "authenticated under the volume key"
            } else {
                "NOT authenticated under the volume key (run `cloakfs upgrade`)"
            }
        );
    }
    if let Some(k) = crate::commands::slots::describe_key_source(&c) {
        println!("key source:      {k}");
    }
    // The fingerprint is derived from the master key: without a secret, only what this machine
    // remembers can be shown, and it says nothing about the config on disk now.
    let remembered = KnownVolumes::for_this_user().and_then(|k| k.get(&p.volume_id));
    match remembered {
        Ok(Some(v)) => println!(
            "key fingerprint: needs the key to compute; this machine remembers {} (since {})",
            v.fingerprint,
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(v.first_seen)
            )
        ),
        Ok(None) => println!(
            "key fingerprint: needs the key to compute; this machine has not opened this volume"
        ),
        Err(e) => println!("key fingerprint: needs the key to compute ({e})"),
    }
    println!("key slots:       {}", c.slots().len());
    for s in c.slots() {
        println!("  {}", crate::commands::slots::describe(s));
    }
    Ok(())
}

/// What `info` shows, as one JSON object.
fn as_json(cipherdir: &std::path::Path, c: &VolumeConfig) -> serde_json::Value {
    let p = &c.params;
    let remembered = KnownVolumes::for_this_user()
        .and_then(|k| k.get(&p.volume_id))
        .ok()
        .flatten()
        .map(|v| {
            serde_json::json!({
                "fingerprint": v.fingerprint.to_string(),
                "first_seen": humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(v.first_seen)
                ).to_string(),
            })
        });
    serde_json::json!({
        "config": config_path(cipherdir),
        "volume_id": b64(&p.volume_id),
        "format_version": FORMAT_VERSION,
        "content_cipher": p.content.name(),
        "integrity_warning": p.content.integrity_warning(),
        "name_cipher": "aes-256-siv",
        "block_size": p.block_size,
        "holes": if p.strict_holes { "strict" } else { "sparse" },
        "long_name_max": p.long_name_max,
        "sharing": p.file_keys == FileKeys::Wrapped,
        "shared_header_mac": p.file_keys == FileKeys::Wrapped && p.shared_header_mac,
        "key_source": crate::commands::slots::describe_key_source(c),
        "remembered": remembered,
        "slots": c.slots().iter().map(crate::commands::slots::describe_json).collect::<Vec<_>>(),
    })
}
