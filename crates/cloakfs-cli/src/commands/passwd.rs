//! `cloakfs passwd` (not implemented yet).

use crate::failure::{Failure, Result};

#[derive(Debug, clap::Args)]
pub struct PasswdArgs {
    /// The volume.
    pub cipherdir: std::path::PathBuf,
}

pub fn run(_args: PasswdArgs) -> Result<()> {
    Err(Failure::other("cloakfs passwd is not implemented yet"))
}
