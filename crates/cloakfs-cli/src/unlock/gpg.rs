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
    let stderr = String::from_utf8_lossy(&out.stderr);
    // gpg's last meaningful line says why it failed.
    let why = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| l.trim_start_matches("gpg: "))
        .next_back()
        .unwrap_or("")
        .to_string();
    Ok((out.status.success(), stdout, why))
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
    let (ok, ct, why) = run(&args, kek.expose())?;
    if !ok || ct.is_empty() {
        return Err(Failure::other(format!(
            "gpg could not encrypt to {}: {why}",
            recipients.join(", ")
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
    let (ok, pt, why) = run(
        &[
            "--batch",
            "--quiet",
            "--no-tty",
            "--decrypt",
            "--output",
            "-",
        ],
        &ct,
    )?;
    if !ok {
        return Err(Failure::new(
            code::WRONG_SECRET,
            format!("gpg could not decrypt key slot {}: {why}", slot.id()),
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
