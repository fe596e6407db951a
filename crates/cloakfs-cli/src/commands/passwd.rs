//! `cloakfs passwd`: change a passphrase. The passphrase slot that the old passphrase opens is
//! replaced in place (same ID and label, fresh salt, new wrap of the same master key) in one
//! atomic config write; no file of the volume is touched.

use crate::args::UnlockArgs;
use crate::commands::slots::KdfArgs;
use crate::failure::{Failure, Result};
use crate::secret_input::{read_passphrase_from, Confirm};
use cloakfs_core::format::config::VolumeConfig;
use cloakfs_core::slots::{kind, passphrase};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct PasswdArgs {
    /// The old passphrase (or another secret that opens a passphrase slot).
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// Read the new passphrase from the first line of FILE ("-" for standard input).
    #[arg(long, value_name = "FILE", conflicts_with = "new_extpass")]
    pub new_passfile: Option<PathBuf>,
    /// Run CMD with /bin/sh and use the first line it prints as the new passphrase.
    #[arg(long, value_name = "CMD")]
    pub new_extpass: Option<String>,
    /// Argon2id cost of the new slot (default: the old slot's).
    #[command(flatten)]
    pub kdf: KdfArgs,
    /// The volume's cipher directory (or its config file).
    pub cipherdir: PathBuf,
}

pub fn run(args: PasswdArgs) -> Result<()> {
    let mut config = VolumeConfig::load(&args.cipherdir)?;
    if !config.has_stored_key() {
        return Err(Failure::usage(
            "this volume has no stored key (made with --no-stored-key): its passphrase is the \
             key itself and cannot be changed without re-encrypting every file",
        ));
    }
    if args.new_passfile.is_some() && args.new_passfile == args.unlock.passfile {
        return Err(Failure::usage(
            "--passfile and --new-passfile name the same file",
        ));
    }
    let u = crate::unlock::open_config(&args.unlock, &config, &args.cipherdir, |_| true)?;
    let slot = config
        .slot(u.slot_id)
        .cloned()
        .ok_or_else(|| Failure::other("the slot that opened the volume vanished"))?;
    if slot.kind() != kind::PASSPHRASE {
        return Err(Failure::usage(format!(
            "the secret given opens key slot {} ({}), not a passphrase slot: add a passphrase \
             with `cloakfs slots add --new-passfile FILE` and remove old slots with \
             `cloakfs slots remove`",
            slot.id(),
            slot.kind()
        )));
    }
    let params = args.kdf.resolve(Some(slot.argon2()?))?;
    let new = read_passphrase_from(
        args.new_passfile.as_deref(),
        args.new_extpass.as_deref(),
        "New passphrase: ",
        Confirm::Twice,
    )?;
    let rnd = cloakfs_core::slots::SlotRandomness::fresh();
    let (fields, kek) = passphrase::new_slot(&new, params, &rnd.salt)?;
    config.replace_slot(
        slot.id(),
        &u.master_key,
        kind::PASSPHRASE,
        slot.label(),
        fields,
        &kek,
        rnd.nonce,
    )?;
    config.seal(&u.master_key);
    config.save(&args.cipherdir)?;
    println!(
        "Passphrase of key slot {} changed (the master key was re-wrapped; no file was rewritten).",
        slot.id()
    );
    Ok(())
}
