//! Unlocking a volume from the secrets given on the command line. Every command that needs the
//! master key (mount, cat, fsck, ...) goes through [`unlock`], so each slot kind works everywhere.

use crate::cli::UnlockArgs;
use crate::failure::Result;
use crate::secret_input::{read_passphrase, Confirm};
use cloakfs_core::Volume;
use std::path::Path;

/// Unlocks the volume at `cipherdir` with the secrets in `args`.
pub fn unlock(args: &UnlockArgs, cipherdir: &Path) -> Result<Volume> {
    let pass = read_passphrase(args, "Passphrase: ", Confirm::Once)?;
    Ok(Volume::unlock(cipherdir, &pass)?)
}
