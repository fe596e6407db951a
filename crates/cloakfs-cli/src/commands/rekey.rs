//! `cloakfs rekey` (not implemented yet).

use crate::failure::{Failure, Result};

#[derive(Debug, clap::Args)]
pub struct RekeyArgs {
    /// The volume.
    pub cipherdir: std::path::PathBuf,
}

pub fn run(_args: RekeyArgs) -> Result<()> {
    Err(Failure::other("cloakfs rekey is not implemented yet"))
}
