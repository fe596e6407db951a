//! `cloakfs rekey`: move a volume to a fresh master key, re-encrypting every file, name,
//! symlink target and xattr; interruptible, resumable and reversible. The engine and its
//! crash-safety design are in `cloakfs_core::tools::rekey`.

use super::fsck::Bar;
use crate::args::UnlockArgs;
use crate::failure::{code, Failure, Result};
use cloakfs_core::known_volumes::{KnownVolumes, Place};
use cloakfs_core::tools::mounts;
use cloakfs_core::tools::rekey::{self, Options, Outcome};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct RekeyArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// Finish an interrupted rekey (unlock with the same secret as before).
    #[arg(long, conflicts_with = "rollback")]
    pub resume: bool,
    /// Undo an interrupted rekey: everything goes back under the old key.
    #[arg(long)]
    pub rollback: bool,
    /// Remove the key slots other than the one you unlock with (they cannot be re-wrapped
    /// without their secrets); without it, a volume with other slots is refused.
    #[arg(long, conflicts_with_all = ["resume", "rollback"])]
    pub drop_other_slots: bool,
    /// The volume's cipher directory.
    pub cipherdir: PathBuf,
}

pub fn run(args: RekeyArgs) -> Result<()> {
    let cipherdir = std::fs::canonicalize(&args.cipherdir).map_err(|e| {
        Failure::new(
            code::VOLUME,
            format!("cipher directory {}: {e}", args.cipherdir.display()),
        )
    })?;
    mounts::check_not_mounted(&cipherdir)?;
    let journal = rekey::journal_path(&cipherdir).exists();
    if !args.resume && !args.rollback {
        rekey::check_not_rekeying(&cipherdir)?;
    } else if !journal {
        return Err(Failure::usage(format!(
            "no interrupted rekey of {} to {}",
            cipherdir.display(),
            if args.resume { "resume" } else { "roll back" }
        )));
    }
    let volume = crate::unlock::unlock_at(
        &args.unlock,
        &Place::resolved(&args.cipherdir, cipherdir.clone()),
    )?;
    let known = KnownVolumes::for_this_user()?;
    let bar = Bar::new("re-encrypting");
    bar.catch_signals();
    let start = std::time::Instant::now();
    let res = if args.resume {
        rekey::resume(&volume, &cipherdir, Some(&known), &bar)
    } else if args.rollback {
        rekey::rollback(&volume, &cipherdir, Some(&known), &bar)
    } else {
        rekey::start(
            &volume,
            &cipherdir,
            Options {
                drop_other_slots: args.drop_other_slots,
                known: Some(&known),
            },
            &bar,
        )
    };
    bar.finish();
    let s = match res {
        Ok(s) => s,
        Err(e) if bar.stopped() => return Err(Failure::new(code::INTERRUPTED, e.to_string())),
        Err(e) => {
            let tampered = matches!(e, cloakfs_core::Error::Tampered(_));
            let mut f = Failure::from(e);
            if tampered {
                f.code = code::PROBLEMS;
            }
            if rekey::journal_path(&cipherdir).exists() {
                f.message.push_str(
                    " (the volume is consistent: `cloakfs rekey --resume` or `--rollback` after \
                     fixing the cause)",
                );
            }
            return Err(f);
        }
    };
    let secs = start.elapsed().as_secs_f64();
    for d in &s.damaged {
        eprintln!("cloakfs: left as it was (opens under neither key): {d}");
    }
    if s.temporaries_removed > 0 {
        eprintln!(
            "cloakfs: finished or removed {} temporary files of the interrupted run",
            s.temporaries_removed
        );
    }
    if !s.dropped_slots.is_empty() {
        let ids: Vec<String> = s.dropped_slots.iter().map(u32::to_string).collect();
        eprintln!(
            "cloakfs: removed key slots {} (add them again with `cloakfs slots add`)",
            ids.join(", ")
        );
    }
    let work = format!(
        "{} files ({} bytes, {} in place), {} names, {} symlinks, {} xattrs re-encrypted{} in {:.1} s",
        s.files,
        s.bytes,
        s.in_place,
        s.names,
        s.symlinks,
        s.xattrs,
        if s.already > 0 {
            format!(", {} already done", s.already)
        } else {
            String::new()
        },
        secs
    );
    let work = format!("{work} ({} atomic steps)", s.steps);
    match s.outcome {
        Outcome::Completed => {
            println!("rekeyed {}: {work}", cipherdir.display());
            Ok(())
        }
        Outcome::RolledBack => {
            println!("rolled back {} to its old key: {work}", cipherdir.display());
            Ok(())
        }
        Outcome::AlreadyComplete if args.resume => {
            println!(
                "the rekey of {} had already completed; its journal was removed",
                cipherdir.display()
            );
            Ok(())
        }
        Outcome::AlreadyComplete => Err(Failure::other(
            "cannot roll back: the rekey had already completed (the volume uses the new key); \
             its journal was removed",
        )),
    }
}
