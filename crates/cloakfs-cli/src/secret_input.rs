//! Reading secrets: passphrases (a file, an external program, or the terminal without echo),
//! key files, PINs. Never from a command-line argument, where other users could read it in `ps`.

use crate::args::{NewPassArgs, UnlockArgs};
use crate::failure::{Failure, Result};
use cloakfs_core::crypto::secret::Passphrase;
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
    read_passphrase_from(
        args.passfile.as_deref(),
        args.extpass.as_deref(),
        prompt,
        confirm,
    )
}

/// Gets a new passphrase (asked twice when it comes from the terminal).
pub fn read_new_passphrase(args: &NewPassArgs, prompt: &str) -> Result<Passphrase> {
    read_passphrase_from(
        args.passfile.as_deref(),
        args.extpass.as_deref(),
        prompt,
        Confirm::Twice,
    )
}

/// Gets a passphrase from a passfile, an extpass program, or the terminal.
pub fn read_passphrase_from(
    passfile: Option<&Path>,
    extpass: Option<&str>,
    prompt: &str,
    confirm: Confirm,
) -> Result<Passphrase> {
    let (raw, source) = if let Some(path) = passfile {
        (from_file(path)?, "a passfile")
    } else if let Some(cmd) = extpass {
        (from_program(cmd)?, "an extpass program")
    } else {
        (from_terminal(prompt, confirm)?, "")
    };
    if raw.is_empty() {
        return Err(Failure::usage("the passphrase is empty"));
    }
    // A new passphrase typed at the terminal was judged there, before it was confirmed; one
    // from a file or program is judged here, once. A warning only: the owner decides.
    if confirm == Confirm::Twice && !source.is_empty() {
        if let Some(w) = std::str::from_utf8(&raw).ok().and_then(weakness) {
            eprintln!("cloakfs: warning: the new passphrase from {source}: {w}");
        }
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

/// Reads a whole secret file ("-" for standard input), at most `max` bytes.
pub fn read_secret_file(path: &Path, what: &str, max: usize) -> Result<Zeroizing<Vec<u8>>> {
    let mut buf = Zeroizing::new(Vec::new());
    let limit = max as u64 + 1;
    let res = if path == Path::new("-") {
        std::io::stdin().take(limit).read_to_end(&mut buf)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(limit).read_to_end(&mut buf))
    };
    res.map_err(|e| Failure::other(format!("cannot read {what} {}: {e}", path.display())))?;
    if buf.len() > max {
        return Err(Failure::usage(format!(
            "{what} {} is larger than {max} bytes",
            path.display()
        )));
    }
    if buf.is_empty() {
        return Err(Failure::usage(format!(
            "{what} {} is empty",
            path.display()
        )));
    }
    Ok(buf)
}

/// Reads the first line of a small secret file ("-" for standard input), e.g. a PIN.
pub fn read_first_line(path: &Path, what: &str) -> Result<Zeroizing<Vec<u8>>> {
    let line = first_line(read_secret_file(path, what, MAX_SECRET as usize)?);
    if line.is_empty() {
        return Err(Failure::usage(format!(
            "{what} {} has an empty first line",
            path.display()
        )));
    }
    Ok(line)
}

/// Asks for a secret on the terminal without echo (once).
pub fn prompt_secret(prompt: &str, what: &str, alternative: &str) -> Result<Zeroizing<String>> {
    let s = Zeroizing::new(rpassword::prompt_password(prompt).map_err(|e| {
        Failure::usage(format!(
            "cannot prompt for the {what} ({e}): use {alternative}"
        ))
    })?);
    if s.is_empty() {
        return Err(Failure::usage(format!("the {what} is empty")));
    }
    Ok(s)
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
        if let Some(w) = weakness(&first) {
            eprintln!("cloakfs: warning: {w}");
        }
    }
    Ok(Zeroizing::new(first.as_bytes().to_vec()))
}

/// Why a new passphrase is weak, by zxcvbn's estimate (None: strong enough). Only a warning:
/// the owner decides, and a KDF slows every guess down.
pub fn weakness(pass: &str) -> Option<String> {
    let estimate = zxcvbn::zxcvbn(pass, &[]);
    let score = u8::from(estimate.score());
    if score >= 3 {
        return None;
    }
    let why = estimate
        .feedback()
        .and_then(|f| f.warning())
        .map(|w| format!(": {}", w.to_string().trim_end_matches('.')))
        .unwrap_or_default();
    Some(format!(
        "this passphrase is weak (strength {score} of 4{why}); a longer one, e.g. several \
         random words, resists guessing far better"
    ))
}

#[cfg(test)]
mod tests {
    use super::weakness;

    #[test]
    fn weak_and_strong() {
        assert!(weakness("password1").is_some());
        assert!(weakness("qwerty").unwrap().contains("strength 0 of 4"));
        assert!(weakness("correct horse battery staple meadow").is_none());
    }
}
