//! `cloakfs cat`: decrypt one file to standard output without mounting (CFS `ccat`), by its
//! plaintext path, or (`--raw`) a single backing file given only the volume's key.

use crate::args::UnlockArgs;
use crate::failure::{code, Failure, Result};
use cloakfs_core::tools::blocks::{BlockReader, CHUNK_BLOCKS};
use cloakfs_core::tools::{rekey, translate};
use cloakfs_core::{Error, Volume};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct CatArgs {
    #[command(flatten)]
    pub unlock: UnlockArgs,
    /// Decrypt the backing file BACKINGFILE itself (no name is decrypted; works on a copied
    /// or detached backing file too).
    #[arg(long)]
    pub raw: bool,
    /// With --raw: the volume's cipher directory (default: the nearest directory above the
    /// backing file that holds cloakfs.conf).
    #[arg(long, value_name = "CIPHERDIR", requires = "raw")]
    pub volume: Option<PathBuf>,
    /// The volume's cipher directory; with --raw, the backing file.
    // A backing file's name is base64url and may begin with '-'.
    #[arg(value_name = "CIPHERDIR|BACKINGFILE", allow_hyphen_values = true)]
    pub first: PathBuf,
    /// Plaintext path of the file inside the volume (symlinks inside the volume are followed).
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,
}

pub fn run(args: CatArgs) -> Result<()> {
    if args.raw {
        if args.path.is_some() {
            return Err(Failure::usage(
                "cat --raw takes one backing file (and --volume CIPHERDIR), not a plaintext path",
            ));
        }
        let backing = &args.first;
        if !backing.is_file() {
            return Err(Failure::usage(format!(
                "{} is not a regular backing file",
                backing.display()
            )));
        }
        let cipherdir = match &args.volume {
            Some(v) => v.clone(),
            None => translate::find_volume_root(backing).ok_or_else(|| {
                Failure::new(
                    code::VOLUME,
                    format!(
                        "no cloakfs.conf in any directory above {}: give the volume with \
                         --volume CIPHERDIR",
                        backing.display()
                    ),
                )
            })?,
        };
        let volume = crate::unlock::unlock(&args.unlock, &cipherdir)?;
        return stream(&volume, backing, &backing.display().to_string());
    }
    let Some(path) = &args.path else {
        return Err(Failure::usage(
            "usage: cloakfs cat CIPHERDIR PATH (or cloakfs cat --raw BACKINGFILE)",
        ));
    };
    let cipherdir = &args.first;
    rekey::check_not_rekeying(cipherdir)?;
    let volume = crate::unlock::unlock(&args.unlock, cipherdir)?;
    let backing =
        translate::lookup(&volume, cipherdir, path, true).map_err(|e| located(path, e))?;
    let label = format!("/{}", path.strip_prefix("/").unwrap_or(path).display());
    match std::fs::symlink_metadata(&backing) {
        Ok(m) if m.is_file() => stream(&volume, &backing, &label),
        Ok(m) if m.is_dir() => Err(Failure::usage(format!("{label} is a directory"))),
        Ok(_) => Err(Failure::usage(format!("{label} is not a regular file"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Failure::other(format!(
            "{label}: no such file in the volume"
        ))),
        Err(e) => Err(Failure::other(format!("{label}: {e}"))),
    }
}

fn located(path: &Path, e: Error) -> Failure {
    let mut f = Failure::from(e);
    f.message = format!("{}: {}", path.display(), f.message);
    f
}

/// Writes the plaintext of backing file `backing` to standard output, chunk by chunk. Stops
/// before the first block that fails authentication (nothing of it is written).
fn stream(volume: &Volume, backing: &Path, label: &str) -> Result<()> {
    let file = std::fs::File::open(backing)
        .map_err(|e| Failure::other(format!("{}: {e}", backing.display())))?;
    let r = BlockReader::open(volume.content(), file).map_err(|e| match e {
        Error::Io(e) => Failure::other(format!("{label}: {e}")),
        e => Failure::new(code::PROBLEMS, format!("{label}: {e}")),
    })?;
    let bs = r.layout().block_size();
    let mut out = std::io::stdout().lock();
    let (mut plain, mut sealed) = (Vec::new(), Vec::new());
    let mut first = 0;
    let write = |out: &mut std::io::StdoutLock, data: &[u8]| -> Result<bool> {
        match out.write_all(data) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(Failure::other(format!("standard output: {e}"))),
        }
    };
    while first < r.block_count() {
        let chunk = r
            .read_chunk(first, CHUNK_BLOCKS, &mut plain, &mut sealed)
            .map_err(|e| Failure::other(format!("{label}: {e}")))?;
        if let Some(b) = chunk.first_failure() {
            let good = ((b - first) * bs) as usize;
            if write(&mut out, &plain[..good])? {
                let _ = out.flush();
            }
            return Err(Failure::new(
                code::PROBLEMS,
                format!(
                    "{label}: block {b} fails authentication (tampered or damaged); output stops \
                     at byte {}",
                    b * bs
                ),
            ));
        }
        if !write(&mut out, &plain)? {
            return Ok(()); // the reader went away (cat | head)
        }
        first += chunk.states.len() as u64;
    }
    let _ = out.flush();
    if let Some(d) = r.damage() {
        return Err(Failure::new(
            code::PROBLEMS,
            format!("{label}: {d}; output stops at byte {}", r.size()),
        ));
    }
    Ok(())
}
