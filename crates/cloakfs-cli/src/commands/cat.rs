//! `cloakfs cat` (not implemented yet).

use crate::failure::{Failure, Result};

#[derive(Debug, clap::Args)]
pub struct CatArgs {
    /// The volume.
    pub cipherdir: std::path::PathBuf,
}

pub fn run(_args: CatArgs) -> Result<()> {
    Err(Failure::other("cloakfs cat is not implemented yet"))
}
