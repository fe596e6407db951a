//! `gpg` slots (seed 003: the GnuPG key module): the KEK is random and stored encrypted by
//! `gpg --encrypt` to one or more OpenPGP keys; unlocking runs `gpg --decrypt`, so the user's
//! gpg-agent (and its pinentry, smart card, ...) supplies the private key.
//!
//! Fields: `gpg_recipients` (comma-separated key IDs as given, for display) and `gpg` (b64 of
//! the binary OpenPGP message whose plaintext is the 32-byte KEK).

use crate::failure::{code, Failure, Result};
use cloakfs_core::format::config::Fields;
use cloakfs_core::format::encoding::b64;
use cloakfs_core::slots::{Kek, KeySlot};
use std::io::Write;
use std::process::{Command, Stdio};
use zeroize::Zeroizing;

/// Largest `gpg` field accepted.
const MAX_CT: usize = 1 << 20;

fn gpg_program() -> String {
    std::env::var("CLOAKFS_GPG").unwrap_or_else(|_| "gpg".to_string())
}

/// Runs gpg with `args`, `input` on standard input; returns standard output.
fn run(args: &[&str], input: &[u8]) -> Result<(bool, Zeroizing<Vec<u8>>, String)> {
    let prog = gpg_program();
    let mut child = Command::new(&prog)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Failure::other(format!("cannot run {prog}: {e} (is gnupg installed?)")))?;
    let mut stdin = child.stdin.take().expect("piped");
    let input = Zeroizing::new(input.to_vec());
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child
        .wait_with_output()
        .map_err(|e| Failure::other(format!("{prog}: {e}")))?;
    let _ = writer.join();
    let stdout = Zeroizing::new(out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    Ok((out.status.success(), stdout, stderr))
}

/// gpg's last meaningful message line says why it failed (status lines left out).
fn why(stderr: &str) -> String {
    stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(STATUS_PREFIX))
        .map(|l| l.trim_start_matches("gpg: "))
        .next_back()
        .unwrap_or("")
        .to_string()
}

/// Prefix of gpg's machine-readable status lines (`--status-fd`, doc/DETAILS in GnuPG).
const STATUS_PREFIX: &str = "[GNUPG:] ";

/// Whether gpg's status lines show a real public-key decryption: a session key from a secret
/// key in the keyring (`DECRYPTION_KEY`), integrity checked (`DECRYPTION_OKAY`), no
/// passphrase-encrypted session key, and one literal packet. gpg exits 0 for an unencrypted
/// literal packet (`gpg --store`) too, and prints its contents: that must never be a KEK,
/// since anyone can make one.
fn public_key_decryption(stderr: &str) -> std::result::Result<(), &'static str> {
    let status: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix(STATUS_PREFIX))
        .collect();
    let has = |kw: &str| status.iter().any(|l| l.split(' ').next() == Some(kw));
    let count = |kw: &str| {
        status
            .iter()
            .filter(|l| l.split(' ').next() == Some(kw))
            .count()
    };
    if has("NEED_PASSPHRASE_SYM") || has("SYM_ENCRYPTED") {
        return Err("it is encrypted with a passphrase, not to a public key");
    }
    if !has("DECRYPTION_KEY") {
        return Err("it is not encrypted to a key in your keyring (no public-key decryption)");
    }
    if !has("DECRYPTION_OKAY") || has("DECRYPTION_FAILED") {
        return Err("gpg did not report a successful, integrity-checked decryption");
    }
    if count("PLAINTEXT") != 1 {
        return Err("it does not hold exactly one literal data packet");
    }
    Ok(())
}

/// Encrypts a fresh KEK to `recipients` and returns the new slot's fields and KEK.
pub fn new_slot(recipients: &[String]) -> Result<(Fields, Kek)> {
    if recipients.is_empty() {
        return Err(Failure::usage("no gpg recipient given"));
    }
    for r in recipients {
        if r.is_empty() || r.contains([',', '\n', '\0']) || r.starts_with('-') {
            return Err(Failure::usage(format!("invalid gpg recipient {r:?}")));
        }
    }
    let kek = Kek::random();
    let mut args = vec!["--batch", "--quiet", "--yes", "--no-tty", "--encrypt"];
    for r in recipients {
        args.push("--recipient");
        args.push(r);
    }
    args.extend(["--output", "-"]);
    let (ok, ct, stderr) = run(&args, kek.expose())?;
    if !ok || ct.is_empty() {
        return Err(Failure::other(format!(
            "gpg could not encrypt to {}: {}",
            recipients.join(", "),
            why(&stderr)
        )));
    }
    let mut f = Fields::new();
    f.insert("gpg_recipients".into(), recipients.join(","));
    f.insert("gpg".into(), b64(&ct));
    Ok((f, kek))
}

/// Decrypts the slot's KEK with `gpg --decrypt`.
pub fn kek(slot: &KeySlot) -> Result<Option<Kek>> {
    let ct = slot.var_bytes("gpg", MAX_CT)?;
    let (ok, pt, stderr) = run(
        &[
            "--batch",
            "--quiet",
            "--no-tty",
            "--status-fd",
            "2",
            "--decrypt",
            "--output",
            "-",
        ],
        &ct,
    )?;
    if !ok {
        return Err(Failure::new(
            code::WRONG_SECRET,
            format!(
                "gpg could not decrypt key slot {}: {}",
                slot.id(),
                why(&stderr)
            ),
        ));
    }
    if let Err(what) = public_key_decryption(&stderr) {
        return Err(Failure::new(
            code::VOLUME,
            format!(
                "key slot {} is refused: {what}; the volume config may have been replaced",
                slot.id()
            ),
        ));
    }
    let k: [u8; 32] = pt[..].try_into().map_err(|_| {
        Failure::new(
            code::VOLUME,
            format!(
                "damaged volume config: slot {}: gpg data does not hold a 32-byte key",
                slot.id()
            ),
        )
    })?;
    Ok(Some(Kek::from_slice(&k)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const REAL: &str = "[GNUPG:] ENC_TO 82646B2EBB838182 1 0
[GNUPG:] KEY_CONSIDERED FCEB0D014DE88541087112DF1E5C344BE3DF5A69 0
[GNUPG:] DECRYPTION_KEY 9E9B6F100D75B583AA66FA2C82646B2EBB838182 FCEB0D014DE88541087112DF1E5C344BE3DF5A69 u
[GNUPG:] BEGIN_DECRYPTION
[GNUPG:] DECRYPTION_INFO 2 9 0
[GNUPG:] PLAINTEXT 62 1795516800 kek
[GNUPG:] PLAINTEXT_LENGTH 32
[GNUPG:] DECRYPTION_OKAY
[GNUPG:] GOODMDC
[GNUPG:] END_DECRYPTION
";

    #[test]
    fn only_a_public_key_decryption_is_accepted() {
        assert_eq!(public_key_decryption(REAL), Ok(()));
        // `gpg --store`: a literal packet, no encryption at all.
        let stored = "[GNUPG:] PLAINTEXT 62 1795516800 kek\n[GNUPG:] PLAINTEXT_LENGTH 32\n";
        assert!(public_key_decryption(stored).is_err());
        let sym = REAL.replace(
            "[GNUPG:] ENC_TO",
            "[GNUPG:] NEED_PASSPHRASE_SYM 9 3 2\n[GNUPG:] X",
        );
        assert!(public_key_decryption(&sym).is_err());
        let two = REAL.replace(
            "[GNUPG:] PLAINTEXT_LENGTH",
            "[GNUPG:] PLAINTEXT 62 0 x\n[GNUPG:] PLAINTEXT_LENGTH",
        );
        assert!(public_key_decryption(&two).is_err());
        // A status keyword inside a human message line does not count.
        let fake = "gpg: [GNUPG:] DECRYPTION_KEY x\n[GNUPG:] PLAINTEXT 62 0 k\n\
                    [GNUPG:] DECRYPTION_OKAY\n";
        assert!(public_key_decryption(fake).is_err());
    }
}
