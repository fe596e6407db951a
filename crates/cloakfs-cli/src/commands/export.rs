//! `cloakfs export`: copy the whole plaintext tree out of a volume without mounting (disaster
//! recovery), skipping and listing what cannot be read. The copying is `cloakfs_core::tools::export`.

use super::fsck::Bar;
use crate::args::UnlockArgs;
use crate::failure::{code, Failure, Result};
use cloakfs_core::tools::{export, mounts, rekey};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// The volume's cipher directory.
    pub cipherdir: PathBuf,
    /// Where the plaintext tree goes: a new or empty directory.
    pub dest: PathBuf,
}

pub fn run(args: ExportArgs) -> Result<()> {
    rekey::check_not_rekeying(&args.cipherdir)?;
    if let Ok(mut rd) = std::fs::read_dir(&args.dest) {
        if rd.next().is_some() {
            return Err(Failure::usage(format!(
                "{} is not empty: export needs a new or empty directory",
                args.dest.display()
            )));
        }
    }
    if let Ok(Some(m)) = mounts::mounted_at(&args.cipherdir) {
        eprintln!(
            "cloakfs: note: the volume is mounted on {}; files written meanwhile may be skipped",
            m.display()
        );
    }
    let volume = crate::unlock::unlock(&args.unlock, &args.cipherdir)?;
    let bar = Bar::new("exporting");
    let start = std::time::Instant::now();
    let r = export::export(&volume, &args.cipherdir, &args.dest, &bar)?;
    bar.finish();
    for n in &r.notes {
        eprintln!("cloakfs: note: {n}");
    }
    println!(
        "exported {} files ({} bytes), {} directories, {} symlinks, {} fifos, {} hard links to {} \
         in {:.1} s",
        r.files,
        r.bytes,
        r.directories,
        r.symlinks,
        r.fifos,
        r.hard_links,
        args.dest.display(),
        start.elapsed().as_secs_f64()
    );
    if r.skipped.is_empty() {
        return Ok(());
    }
    for s in &r.skipped {
        eprintln!("cloakfs: skipped {}: {}", s.location, s.reason);
    }
    Err(Failure::new(
        code::PROBLEMS,
        format!(
            "{} unreadable entries were skipped (listed above); everything else was exported",
            r.skipped.len()
        ),
    ))
}
