//! `cloakfs name`: translate names between the plaintext view and the cipher directory without
//! mounting (CFS `cname`), long names included.

use crate::args::UnlockArgs;
use crate::failure::{Failure, Result};
use cloakfs_core::format::names::{sidecar_name, LONG_PREFIX};
use cloakfs_core::tools::{rekey, translate};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct NameArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// Translate a backing path (absolute, or relative to CIPHERDIR) to its plaintext path.
    #[arg(short, long)]
    pub decrypt: bool,
    /// The volume's cipher directory.
    pub cipherdir: PathBuf,
    /// A plaintext path inside the volume (default), or a backing path (--decrypt).
    // Encrypted names are base64url and may begin with '-'.
    #[arg(allow_hyphen_values = true)]
    pub path: PathBuf,
}

pub fn run(args: NameArgs) -> Result<()> {
    rekey::check_not_rekeying(&args.cipherdir)?;
    let volume = crate::unlock::unlock(&args.unlock, &args.cipherdir)?;
    let mut out = std::io::stdout().lock();
    let res = if args.decrypt {
        let (plain, notes) = translate::decrypt_path_noting(&volume, &args.cipherdir, &args.path)
            .map_err(|e| located(&args.path, e))?;
        for n in notes {
            eprintln!("cloakfs: {n}");
        }
        out.write_all(b"/")
            .and_then(|()| out.write_all(plain.as_os_str().as_bytes()))
    } else {
        let backing = translate::lookup(&volume, &args.cipherdir, &args.path, false)
            .map_err(|e| located(&args.path, e))?;
        // Which parts of the path are named under a copy of their directory's ID file, as
        // `name -d` tells it.
        if backing.symlink_metadata().is_ok() {
            if let Ok((_, notes)) =
                translate::decrypt_path_noting(&volume, &args.cipherdir, &backing)
            {
                for n in notes {
                    eprintln!("cloakfs: {n}");
                }
            }
        }
        if let Some(n) = backing.file_name().and_then(|n| n.to_str()) {
            if n.starts_with(LONG_PREFIX) {
                eprintln!(
                    "cloakfs: long name: the full encrypted name is in the sidecar {}",
                    backing.with_file_name(sidecar_name(n)).display()
                );
            }
        }
        out.write_all(backing.as_os_str().as_bytes())
    };
    res.and_then(|()| out.write_all(b"\n"))
        .map_err(|e| Failure::other(format!("standard output: {e}")))
}

fn located(path: &std::path::Path, e: cloakfs_core::Error) -> Failure {
    let mut f = Failure::from(e);
    f.message = format!("{}: {}", path.display(), f.message);
    f
}
