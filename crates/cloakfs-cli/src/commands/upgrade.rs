//! `cloakfs upgrade`: bring a volume made by an older cloakfs to the current format, offline.
//! The steps and their crash safety are in `cloakfs_core::tools::upgrade`.

use crate::args::UnlockArgs;
use crate::failure::{code, Failure, Result};
use cloakfs_core::tools::upgrade;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct UpgradeArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// The volume's cipher directory (unmounted on every machine).
    pub cipherdir: PathBuf,
}

pub fn run(args: UpgradeArgs) -> Result<()> {
    let cipherdir = std::fs::canonicalize(&args.cipherdir).map_err(|e| {
        Failure::new(
            code::VOLUME,
            format!("cipher directory {}: {e}", args.cipherdir.display()),
        )
    })?;
    let volume = crate::unlock::unlock(&args.unlock, &cipherdir)?;
    let done = upgrade::upgrade(&volume, &cipherdir)?;
    if !done.config {
        println!("{} is in the current format already", cipherdir.display());
        return Ok(());
    }
    if volume.is_sharing() && !volume.config().params.shared_header_mac {
        println!(
            "upgraded {}: {} file headers authenticated under the volume key; from now on a \
             file header made without the volume key is refused",
            cipherdir.display(),
            done.headers
        );
    }
    if let Some(n) = done.plaintext_listed {
        println!(
            "upgraded {}: listed its {n} plaintext entries; from now on a plaintext entry that \
             appears in the cipher directory is not shown",
            cipherdir.display()
        );
    }
    Ok(())
}
