//! `cloakfs fsck` (not implemented yet).

use crate::failure::{Failure, Result};

#[derive(Debug, clap::Args)]
pub struct FsckArgs {
    /// The volume.
    pub cipherdir: std::path::PathBuf,
}

pub fn run(_args: FsckArgs) -> Result<()> {
    Err(Failure::other("cloakfs fsck is not implemented yet"))
}
