//! `cloakfs slots` (not implemented yet).

use crate::failure::{Failure, Result};

#[derive(Debug, clap::Subcommand)]
pub enum SlotsCommand {
    /// List the key slots.
    List {
        /// The volume.
        cipherdir: std::path::PathBuf,
    },
}

pub fn run(_cmd: SlotsCommand) -> Result<()> {
    Err(Failure::other("cloakfs slots is not implemented yet"))
}
