//! `cloakfs known`: the volumes this machine remembers and the fingerprints of their master
//! keys (key pinning, `cloakfs_core::known_volumes`): list them, trust a new key, forget one.

use crate::args::UnlockArgs;
use crate::failure::{code, Failure, Result};
use clap::{Args, Subcommand};
use cloakfs_core::crypto::keys::KeyFingerprint;
use cloakfs_core::format::config::VolumeConfig;
use cloakfs_core::known_volumes::{self, KnownVolume, KnownVolumes, Place};
use cloakfs_core::text::{b64, unb64_array};
use std::io::{BufRead, Write};
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum KnownCommand {
    /// List the volumes this machine remembers, with their key fingerprints.
    List(ListArgs),
    /// Trust the master key a volume opens to now: after a rekey on another machine, or for a
    /// new volume made in a directory that held another one.
    Accept(Box<AcceptArgs>),
    /// Forget a volume (the next unlock is a first use again).
    Forget(ForgetArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AcceptArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// The fingerprint you expect, as shown on a machine you trust (`cloakfs rekey` and
    /// `cloakfs init` print it); without it, you are asked on the terminal.
    #[arg(long, value_name = "FINGERPRINT", allow_hyphen_values = true)]
    pub fingerprint: Option<String>,
    /// The volume's cipher directory.
    pub cipherdir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ForgetArgs {
    /// A cipher directory, or a volume ID as `cloakfs known list` shows it.
    pub volume: String,
}

pub fn run(cmd: KnownCommand) -> Result<()> {
    let known = KnownVolumes::for_this_user()?;
    match cmd {
        KnownCommand::List(a) => list(&known, a.json),
        KnownCommand::Accept(a) => accept(&known, *a),
        KnownCommand::Forget(a) => forget(&known, &a.volume),
    }
}

fn since(v: &KnownVolume) -> String {
    humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(v.first_seen),
    )
    .to_string()
}

fn list(known: &KnownVolumes, json: bool) -> Result<()> {
    let all = known.list()?;
    if json {
        let out: Vec<serde_json::Value> = all
            .iter()
            .map(|v| {
                serde_json::json!({
                    "volume_id": b64(&v.volume_id),
                    "fingerprint": v.fingerprint.to_string(),
                    "rekey_to": v.pending.map(|p| p.to_string()),
                    "cipherdirs": v.cipherdirs,
                    "first_seen": since(v),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(out));
        return Ok(());
    }
    if all.is_empty() {
        println!(
            "This machine remembers no volume ({}).",
            known.path().display()
        );
        return Ok(());
    }
    for v in &all {
        println!("volume {}", b64(&v.volume_id));
        println!("  fingerprint {}", v.fingerprint);
        if let Some(p) = v.pending {
            println!("  rekey to    {p} (interrupted rekey: both keys open it)");
        }
        println!("  first seen  {}", since(v));
        for d in &v.cipherdirs {
            println!("  opened from {}", d.display());
        }
    }
    Ok(())
}

fn accept(known: &KnownVolumes, args: AcceptArgs) -> Result<()> {
    let expected = match &args.fingerprint {
        Some(t) => Some(KeyFingerprint::parse(t).ok_or_else(|| {
            Failure::usage(format!(
                "--fingerprint {t:?} is not a key fingerprint (43 base64url characters)"
            ))
        })?),
        None => None,
    };
    let place = Place::of(&args.cipherdir);
    let config = VolumeConfig::load(&place.canonical)?;
    let u = crate::unlock::open_config_unpinned(&args.unlock, &config, |_| true)?;
    let id = config.params.volume_id;
    let fp = u.master_key.fingerprint(&id);
    let all = known.list()?;
    let by_id = all.iter().find(|v| v.volume_id == id);
    let by_dir = place.held_by_other(&all, &id);
    if by_id.is_some_and(|v| v.fingerprint == fp && v.pending.is_none()) && by_dir.is_none() {
        known.accept(&place, &id, &fp)?;
        println!(
            "Volume {} is already remembered with this key ({fp}).",
            b64(&id)
        );
        return Ok(());
    }
    println!(
        "Volume {} at {place} opens to master-key fingerprint {fp}.",
        b64(&id)
    );
    match by_id {
        Some(v) => println!(
            "This machine remembers it with fingerprint {} (since {}).",
            v.fingerprint,
            since(v)
        ),
        None => println!("This machine has not opened this volume before."),
    }
    if let Some(v) = by_dir {
        println!(
            "This directory held volume {} when this machine last opened it.",
            b64(&v.volume_id)
        );
    }
    // A reverse view's config file has no root to count.
    if place.canonical.is_dir() {
        let volume = cloakfs_core::Volume::from_master_key(config.clone(), &u.master_key)?;
        let census = known_volumes::root_census(&volume, &place.canonical)?;
        if census.foreign > 0 {
            println!(
                "Its root holds {}, and {} of its own: a replaced config with the old entries \
                 renamed aside looks like this.",
                census.foreign_entries(),
                census.own
            );
        }
    }
    match expected {
        Some(e) if e == fp => {}
        Some(e) => {
            return Err(Failure::new(
                code::VOLUME,
                format!(
                    "the volume opens to fingerprint {fp}, not to {e} that you gave: nothing \
                     changed (its config may have been replaced)"
                ),
            ))
        }
        None => confirm()?,
    }
    known.accept(&place, &id, &fp)?;
    println!(
        "Remembered: volume {} with fingerprint {fp} ({}).",
        b64(&id),
        known.path().display()
    );
    Ok(())
}

/// Asks on the terminal; refuses without one.
fn confirm() -> Result<()> {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(|_| {
            Failure::usage(
                "no terminal to ask on: compare the fingerprint above with the one shown on a \
                 machine you trust, then give it with --fingerprint",
            )
        })?;
    let mut w = &tty;
    write!(
        w,
        "Trust this key from now on? Only if you rekeyed the volume yourself or compared the \
         fingerprint with one shown on a machine you trust. [y/N] "
    )?;
    let mut answer = String::new();
    std::io::BufReader::new(&tty).read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        Err(Failure::new(code::VOLUME, "not accepted: nothing changed"))
    }
}

fn forget(known: &KnownVolumes, target: &str) -> Result<()> {
    let id = match unb64_array::<16>(target) {
        Some(id) => id,
        None => {
            let target = std::path::Path::new(target);
            std::fs::symlink_metadata(target).map_err(|e| {
                Failure::usage(format!(
                    "{}: {e} (give a cipher directory or a volume ID)",
                    target.display()
                ))
            })?;
            let place = Place::of(target);
            let all = known.list()?;
            let found = place.remembered_in(&all).next().map(|v| v.volume_id);
            match found {
                Some(id) => id,
                None => {
                    return Err(Failure::usage(format!(
                        "this machine remembers no volume opened from {place}"
                    )))
                }
            }
        }
    };
    if known.forget(&id)? {
        println!("Forgot volume {}.", b64(&id));
        Ok(())
    } else {
        Err(Failure::usage(format!(
            "this machine remembers no volume {}",
            b64(&id)
        )))
    }
}
