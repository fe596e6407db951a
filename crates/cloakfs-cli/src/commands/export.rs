//! `cloakfs export` (not implemented yet).

use crate::failure::{Failure, Result};

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The volume.
    pub cipherdir: std::path::PathBuf,
}

pub fn run(_args: ExportArgs) -> Result<()> {
    Err(Failure::other("cloakfs export is not implemented yet"))
}
