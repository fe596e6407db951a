//! Running GnuPG (seed 003: the GnuPG key module), for `gpg` key slots and for the gpg
//! entries of shared files (FORMAT.md section 18.1, kind 2): encrypt bytes to OpenPGP keys,
//! decrypt them through the user's gpg-agent (its pinentry, smart card, ...) accepting only an
//! integrity-checked public-key decryption, and tell keys by their fingerprints.
//!
//! The program is `$CLOAKFS_GPG`, else `gpg`. Whose keyring it uses is a [`Keyring`]: this
//! process's (`$GNUPGHOME`, else `~/.gnupg`), or an attaching user's in the multi-user daemon.

use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use zeroize::Zeroizing;

/// Prefix of gpg's machine-readable status lines (`--status-fd`, doc/DETAILS in GnuPG).
const STATUS_PREFIX: &str = "[GNUPG:] ";

/// gpg failed (or could not be run): not a usage error, so an I/O one.
fn failed(message: String) -> Error {
    Error::Io(std::io::Error::other(message))
}

/// The gpg program run.
pub fn program() -> String {
    std::env::var("CLOAKFS_GPG").unwrap_or_else(|_| "gpg".to_string())
}

/// Whose gpg keyring and agent gpg uses: this process's own (the default), or a user's
/// that the multi-user daemon (root) serves: gpg then runs as that user, with only their
/// home and `GNUPGHOME` in its environment, so it reaches their keyring and gpg-agent and
/// nothing of the daemon's.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    user: Option<KeyringUser>,
    /// Another program than [`program`] (tests).
    program: Option<String>,
}

#[derive(Debug, Clone)]
struct KeyringUser {
    uid: u32,
    gid: u32,
    home: PathBuf,
    gnupghome: Option<PathBuf>,
}

/// Most bytes of one gpg output stream read (keys, key listings and messages are far
/// smaller); one more means too many.
const OUTPUT_LIMIT: usize = 1 << 20;

/// Up to [`OUTPUT_LIMIT`] + 1 bytes of `stream` (wiped when dropped).
fn read_capped(stream: impl std::io::Read) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::new());
    let _ = stream.take(OUTPUT_LIMIT as u64 + 1).read_to_end(&mut out);
    out
}

/// What one gpg run gave: whether it exited 0, its standard output (wiped when dropped) and
/// its standard error.
struct Run {
    ok: bool,
    stdout: Zeroizing<Vec<u8>>,
    stderr: String,
}

/// gpg's last meaningful message line says why it failed (status lines left out).
pub fn why(stderr: &str) -> String {
    stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(STATUS_PREFIX))
        .map(|l| l.trim_start_matches("gpg: "))
        .next_back()
        .unwrap_or("")
        .to_string()
}

/// Whether gpg's status lines show a real public-key decryption: a session key from a secret
/// key in the keyring (`DECRYPTION_KEY`), integrity checked (`DECRYPTION_OKAY`), no
/// passphrase-encrypted session key, and one literal packet. gpg exits 0 for an unencrypted
/// literal packet (`gpg --store`) too, and prints its contents: that must never be a key,
/// since anyone can make one.
pub fn public_key_decryption(stderr: &str) -> std::result::Result<(), &'static str> {
    let status: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix(STATUS_PREFIX))
        .collect();
    let count = |kw: &str| {
        status
            .iter()
            .filter(|l| l.split(' ').next() == Some(kw))
            .count()
    };
    let has = |kw: &str| count(kw) > 0;
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

/// Encrypts `data` to `recipients` with this process's keyring (see [`Keyring::encrypt`]).
pub fn encrypt(recipients: &[String], data: &[u8]) -> Result<Vec<u8>> {
    Keyring::default().encrypt(recipients, data)
}

/// Decrypts `message` with this process's keyring (see [`Keyring::decrypt`]).
pub fn decrypt(message: &[u8]) -> std::result::Result<Zeroizing<Vec<u8>>, DecryptError> {
    Keyring::default().decrypt(message)
}

/// The key `id` names in this process's keyring (see [`Keyring::resolve`]).
pub fn resolve(id: &str) -> Result<String> {
    Keyring::default().resolve(id)
}

/// Why [`Keyring::decrypt`] gave no plaintext.
#[derive(Debug)]
pub enum DecryptError {
    /// gpg failed (no secret key, agent refused, damaged message): its reason.
    Failed(String),
    /// gpg decrypted, but not as a public-key, integrity-checked decryption (see
    /// [`public_key_decryption`]): the message is not what it claims.
    NotPublicKey(&'static str),
    /// gpg could not be run.
    Run(Error),
}

/// Whether `s` is a full OpenPGP v4 fingerprint as cloakfs writes it (40 upper-case hex).
pub fn is_fingerprint(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
}

/// The keys of a `--with-colons` listing whose records start with `kind` (`pub` or `sec`):
/// each key's fingerprint, and whether it can encrypt (capital `E` in field 12: some valid
/// subkey can).
fn keys_in(listing: &str, kind: &str) -> Vec<(String, bool)> {
    let mut keys: Vec<(String, bool)> = Vec::new();
    let mut want_fpr = false;
    for line in listing.lines() {
        let f: Vec<&str> = line.split(':').collect();
        match f.first() {
            Some(&k) if k == kind => {
                let encrypts = f.get(11).is_some_and(|c| c.contains('E'));
                keys.push((String::new(), encrypts));
                want_fpr = true;
            }
            Some(&"fpr") if want_fpr => {
                if let (Some(last), Some(fpr)) = (keys.last_mut(), f.get(9)) {
                    last.0 = fpr.to_ascii_uppercase();
                }
                want_fpr = false;
            }
            _ => {}
        }
    }
    keys.retain(|(fpr, _)| is_fingerprint(fpr));
    keys
}

impl Keyring {
    /// The keyring of user `uid` (primary group `gid`, home directory `home`), in
    /// `gnupghome` if given, else the user's default (`home/.gnupg`).
    pub fn of_user(uid: u32, gid: u32, home: PathBuf, gnupghome: Option<PathBuf>) -> Self {
        Self {
            user: Some(KeyringUser {
                uid,
                gid,
                home,
                gnupghome,
            }),
            program: None,
        }
    }

    fn program(&self) -> String {
        self.program.clone().unwrap_or_else(program)
    }

    fn command(&self) -> Command {
        let mut c = Command::new(self.program());
        if let Some(u) = &self.user {
            let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
            // Dropping to the user also drops the daemon's supplementary groups (std clears
            // them when root sets a uid without giving groups).
            c.uid(u.uid)
                .gid(u.gid)
                .env_clear()
                .env("PATH", path)
                .env("HOME", &u.home)
                .current_dir("/");
            if let Some(g) = &u.gnupghome {
                c.env("GNUPGHOME", g);
            }
        }
        c
    }

    /// Runs gpg with `args`, `input` on standard input. What gpg prints is capped at
    /// [`OUTPUT_LIMIT`] bytes per stream: a message from a file header is anyone's, and a
    /// compressed one can unpack to any size.
    fn run(&self, args: &[&str], input: &[u8]) -> Result<Run> {
        let prog = self.program();
        let mut child = self
            .command()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed(format!("cannot run {prog}: {e} (is gnupg installed?)")))?;
        let mut stdin = child.stdin.take().expect("piped");
        let input = Zeroizing::new(input.to_vec());
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        // A stream over the limit is no longer read: gpg is stopped, or it would wait to
        // write it for ever. (Not yet waited for, its pid cannot name another process.)
        let pid = rustix::process::Pid::from_child(&child);
        let stop = move || {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        };
        let stderr = child.stderr.take().expect("piped");
        let errors = std::thread::spawn(move || {
            let e = read_capped(stderr);
            if e.len() > OUTPUT_LIMIT {
                stop();
            }
            e
        });
        let stdout = read_capped(child.stdout.take().expect("piped"));
        if stdout.len() > OUTPUT_LIMIT {
            stop();
        }
        let stderr = errors.join().unwrap_or_default();
        let status = child.wait().map_err(|e| failed(format!("{prog}: {e}")))?;
        let _ = writer.join();
        if stdout.len() > OUTPUT_LIMIT || stderr.len() > OUTPUT_LIMIT {
            return Err(failed(format!(
                "{prog} printed more than {OUTPUT_LIMIT} bytes: stopped"
            )));
        }
        Ok(Run {
            ok: status.success(),
            stdout,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    }

    /// Encrypts `data` to `recipients` (key IDs or fingerprints gpg accepts): the binary OpenPGP
    /// message, integrity protected as gpg makes it.
    pub fn encrypt(&self, recipients: &[String], data: &[u8]) -> Result<Vec<u8>> {
        if recipients.is_empty() {
            return Err(Error::Refused("no gpg recipient given".into()));
        }
        for r in recipients {
            if r.is_empty() || r.contains([',', '\n', '\0']) || r.starts_with('-') {
                return Err(Error::Refused(format!("invalid gpg recipient {r:?}")));
            }
        }
        let mut args = vec!["--batch", "--quiet", "--yes", "--no-tty", "--encrypt"];
        for r in recipients {
            args.push("--recipient");
            args.push(r);
        }
        args.extend(["--output", "-"]);
        let r = self.run(&args, data)?;
        if !r.ok || r.stdout.is_empty() {
            return Err(failed(format!(
                "gpg could not encrypt to {}: {}",
                recipients.join(", "),
                why(&r.stderr)
            )));
        }
        Ok(r.stdout.to_vec())
    }

    /// Decrypts the binary OpenPGP message `message` with `gpg --decrypt` (the gpg-agent supplies
    /// the secret key), accepting only an integrity-checked public-key decryption.
    pub fn decrypt(&self, message: &[u8]) -> std::result::Result<Zeroizing<Vec<u8>>, DecryptError> {
        let r = self
            .run(
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
                message,
            )
            .map_err(DecryptError::Run)?;
        if !r.ok {
            return Err(DecryptError::Failed(why(&r.stderr)));
        }
        public_key_decryption(&r.stderr).map_err(DecryptError::NotPublicKey)?;
        Ok(r.stdout)
    }

    /// The fingerprint of the one key `id` names (anything `gpg --list-keys` takes), which must
    /// be able to encrypt.
    pub fn resolve(&self, id: &str) -> Result<String> {
        if id.is_empty() || id.starts_with('-') || id.contains(['\n', '\0']) {
            return Err(Error::Refused(format!("invalid gpg key ID {id:?}")));
        }
        let r = self.run(
            &["--batch", "--no-tty", "--with-colons", "--list-keys", id],
            b"",
        )?;
        let listing = String::from_utf8_lossy(&r.stdout);
        let keys = keys_in(&listing, "pub");
        match &keys[..] {
            [] => Err(Error::Refused(format!(
                "no gpg key {id:?} in the keyring{}",
                if r.ok {
                    String::new()
                } else {
                    format!(" ({})", why(&r.stderr))
                }
            ))),
            [(fpr, true)] => Ok(fpr.clone()),
            [(fpr, false)] => Err(Error::Refused(format!(
                "gpg key {fpr} ({id}) has no usable encryption subkey"
            ))),
            more => Err(Error::Refused(format!(
                "gpg key ID {id:?} matches {} keys: give the full fingerprint of one",
                more.len()
            ))),
        }
    }

    /// The fingerprints of the secret keys in the keyring that can decrypt.
    pub fn secret_fingerprints(&self) -> Result<Vec<String>> {
        let r = self.run(
            &["--batch", "--no-tty", "--with-colons", "--list-secret-keys"],
            b"",
        )?;
        if !r.ok {
            return Err(failed(format!(
                "gpg could not list the secret keys: {}",
                why(&r.stderr)
            )));
        }
        Ok(keys_in(&String::from_utf8_lossy(&r.stdout), "sec")
            .into_iter()
            .filter(|(_, encrypts)| *encrypts)
            .map(|(fpr, _)| fpr)
            .collect())
    }
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
    fn endless_output_stops_the_program() {
        let dir = tempfile::tempdir().unwrap();
        let endless = dir.path().join("gpg");
        std::fs::write(&endless, "#!/bin/sh\nexec yes\n").unwrap();
        let errors = dir.path().join("gpg-errors");
        std::fs::write(&errors, "#!/bin/sh\nexec yes >&2\n").unwrap();
        for prog in [&endless, &errors] {
            std::fs::set_permissions(prog, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            let k = Keyring {
                user: None,
                program: Some(prog.display().to_string()),
            };
            match k.decrypt(b"") {
                Err(DecryptError::Run(e)) => {
                    assert!(e.to_string().contains("printed more than"), "{e}")
                }
                other => panic!("{other:?}"),
            }
        }
        let k = Keyring {
            user: None,
            program: Some("/nonexistent/gpg".into()),
        };
        let e = k.secret_fingerprints().unwrap_err().to_string();
        assert!(e.contains("cannot run /nonexistent/gpg"), "{e}");
    }

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

    const LISTING: &str = "tru::1:1795516800:0:3:1:5
pub:u:255:22:1E5C344BE3DF5A69:1795516800:::u:::scESC::::::23::0:
fpr:::::::::FCEB0D014DE88541087112DF1E5C344BE3DF5A69:
uid:u::::1795516800::AAAA::Carol <carol@example.org>::::::::::0:
sub:u:255:18:82646B2EBB838182:1795516800::::::e::::::23:
fpr:::::::::9E9B6F100D75B583AA66FA2C82646B2EBB838182:
pub:u:255:22:0000000000000001:1795516800:::u:::scSC::::::23::0:
fpr:::::::::0123456789ABCDEF0123456789ABCDEF00000001:
";

    #[test]
    fn keys_are_told_by_their_primary_fingerprint() {
        assert_eq!(
            keys_in(LISTING, "pub"),
            vec![
                ("FCEB0D014DE88541087112DF1E5C344BE3DF5A69".to_string(), true),
                (
                    "0123456789ABCDEF0123456789ABCDEF00000001".to_string(),
                    false
                ),
            ]
        );
        assert!(keys_in(LISTING, "sec").is_empty());
        assert!(is_fingerprint("FCEB0D014DE88541087112DF1E5C344BE3DF5A69"));
        assert!(!is_fingerprint("fceb0d014de88541087112df1e5c344be3df5a69"));
        assert!(!is_fingerprint("FCEB0D01"));
    }
}
