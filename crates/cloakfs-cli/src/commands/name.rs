//! `cloakfs name` (not implemented yet).

use crate::failure::{Failure, Result};

#[derive(Debug, clap::Args)]
pub struct NameArgs {
    /// The volume.
    pub cipherdir: std::path::PathBuf,
}

pub fn run(_args: NameArgs) -> Result<()> {
    Err(Failure::other("cloakfs name is not implemented yet"))
}
