//! Reading the passphrase: a file, an external program, or the terminal (no echo).
//! Never from a command-line argument, where other users could read it in `ps`.

use crate::cli::UnlockArgs;
use crate::failure::{Failure, Result};
use cloakfs_core::secret::Passphrase;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use zeroize::Zeroizing;

/// Longest secret read from a file or program (a passphrase, not a key file).
const MAX_SECRET: u64 = 64 * 1024;

/// Whether to ask twice (when creating a secret).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Confirm {
    Once,
    Twice,
}

/// Gets the passphrase from the configured source.
pub fn read_passphrase(args: &UnlockArgs, prompt: &str, confirm: Confirm) -> Result<Passphrase> {
    let raw = if let Some(path) = &args.passfile {
        from_file(path)?
    } else if let Some(cmd) = &args.extpass {
        from_program(cmd)?
    } else {
        from_terminal(prompt, confirm)?
    };
    if raw.is_empty() {
        return Err(Failure::usage("the passphrase is empty"));
    }
    Ok(Passphrase::new(raw.to_vec()))
}

fn first_line(mut bytes: Zeroizing<Vec<u8>>) -> Zeroizing<Vec<u8>> {
    if let Some(pos) = bytes.iter().position(|&b| b == b'\n') {
        bytes.truncate(pos);
    }
    if bytes.last() == Some(&b'\r') {
        bytes.pop();
    }
    bytes
}

fn from_file(path: &Path) -> Result<Zeroizing<Vec<u8>>> {
    let mut buf = Zeroizing::new(Vec::new());
    let res = if path == Path::new("-") {
        std::io::stdin().take(MAX_SECRET).read_to_end(&mut buf)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_SECRET).read_to_end(&mut buf))
    };
    res.map_err(|e| Failure::other(format!("cannot read passfile {}: {e}", path.display())))?;
    let line = first_line(buf);
    if line.is_empty() {
        return Err(Failure::usage(format!(
            "passfile {} has an empty first line",
            path.display()
        )));
    }
    Ok(line)
}

fn from_program(cmd: &str) -> Result<Zeroizing<Vec<u8>>> {
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::inherit())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Failure::other(format!("cannot run extpass program: {e}")))?;
    let stdout = Zeroizing::new(out.stdout);
    if !out.status.success() {
        return Err(Failure::other(format!(
            "extpass program failed ({})",
            out.status
        )));
    }
    Ok(first_line(stdout))
}

fn from_terminal(prompt: &str, confirm: Confirm) -> Result<Zeroizing<Vec<u8>>> {
    let no_tty = |e: std::io::Error| {
        Failure::usage(format!(
            "cannot prompt for the passphrase ({e}): use --passfile FILE or --extpass CMD"
        ))
    };
    let first = Zeroizing::new(rpassword::prompt_password(prompt).map_err(no_tty)?);
    if confirm == Confirm::Twice {
        let again = Zeroizing::new(rpassword::prompt_password("Repeat: ").map_err(no_tty)?);
        if *first != *again {
            return Err(Failure::usage("the passphrases do not match"));
        }
    }
    Ok(Zeroizing::new(first.as_bytes().to_vec()))
}
