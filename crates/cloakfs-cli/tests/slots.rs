//! Key slots end to end, on real components: `passwd`, `slots add|list|remove|test` with every
//! slot kind (passphrase, key file, recovery key, age X25519 and ssh recipients made by Debian's
//! `age-keygen` and `ssh-keygen`, a SoftHSM2 PKCS#11 token, GnuPG with a throwaway GNUPGHOME,
//! Shamir shares), volumes without a stored key, crash leftovers, and each kind of bad input.
//!
//! The external tools come from `scripts/install-deps.sh`; a missing tool fails the test with
//! a message saying so (a silently skipped test would hide a regression).

mod common;

use cloakfs_core::crypto::secret::Passphrase;
use cloakfs_core::format::config::VolumeConfig;
use cloakfs_core::slots::Kek;
use common::gpg::GnuPgHome;
use common::*;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The passphrase of `Fixture::new()` volumes.
const PASS: &str = "correct horse battery";

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        stderr(out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs cloakfs with extra environment variables.
fn cloakfs_env(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut c = bin();
    c.args(args).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// Runs cloakfs with `input` on standard input.
fn cloakfs_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = bin()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The command may exit (e.g. on a usage error) before it reads: ignore a broken pipe.
    let _ = child.stdin.take().unwrap().write_all(input);
    child.wait_with_output().unwrap()
}

/// `cloakfs slots test CIPHERDIR <unlock options>`.
fn test_unlock(f: &Fixture, unlock: &[&str]) -> Output {
    cloakfs(&[&["slots", "test", s(&f.cipher)], unlock].concat())
}

fn add(f: &Fixture, new: &[&str]) -> String {
    ok(&cloakfs(
        &[
            &["slots", "add", s(&f.cipher), "--passfile", s(&f.pass)],
            new,
        ]
        .concat(),
    ))
}

fn list(f: &Fixture) -> String {
    ok(&cloakfs(&["slots", "list", s(&f.cipher)]))
}

fn tool(name: &str) -> &str {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{name} is not installed: run scripts/install-deps.sh"
    );
    name
}

fn run_tool(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A small file with `text` in the fixture's temporary directory.
fn file(f: &Fixture, name: &str, text: &[u8]) -> PathBuf {
    let p = f.tmp.path().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn config_text(f: &Fixture) -> String {
    std::fs::read_to_string(f.cipher.join("cloakfs.conf")).unwrap()
}

/// The value of the last `"key": "value"` pair named `key` in the config JSON.
fn config_field(f: &Fixture, key: &str) -> String {
    let text = config_text(f);
    let pat = format!("\"{key}\": \"");
    let start = text
        .rfind(&pat)
        .unwrap_or_else(|| panic!("no {key} in {text}"))
        + pat.len();
    text[start..start + text[start..].find('"').unwrap()].to_string()
}

// ---------------------------------------------------------------------------------------------
// passwd and passphrase slots

/// Every entry under `root` (files by content hash, symlinks by target), recursively.
fn tree_hashes(root: &Path) -> BTreeMap<PathBuf, String> {
    use sha2::{Digest, Sha256};
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                out.insert(rel, format!("link:{:?}", std::fs::read_link(&p).unwrap()));
            } else if m.is_dir() {
                out.insert(rel, "dir".into());
                walk(root, &p, out);
            } else {
                let d = Sha256::digest(std::fs::read(&p).unwrap());
                out.insert(rel, format!("{d:x}"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let m = std::fs::symlink_metadata(e.path()).unwrap();
        let dest = to.join(e.file_name());
        if m.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path()).unwrap(), dest).unwrap();
        } else if m.is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

#[test]
fn passwd_rewraps_and_leaves_every_backing_file_unchanged() {
    // The committed test volume has files, a directory, a long name and a symlink.
    let f = Fixture::bare();
    let committed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../cloakfs-core/tests/vectors/volume");
    copy_tree(&committed, &f.cipher);
    let old = file(&f, "old", b"correct horse battery staple\n");
    let new = file(&f, "new", b"a brand new passphrase\n");
    let conf = f.cipher.join("cloakfs.conf");
    let mut before = tree_hashes(&f.cipher);
    let conf_before = before.remove(Path::new("cloakfs.conf")).unwrap();
    assert!(before.len() >= 8, "{before:?}");

    // A wrong old passphrase changes nothing.
    let out = cloakfs(&[
        "passwd",
        s(&f.cipher),
        "--passfile",
        s(&new),
        "--new-passfile",
        s(&old),
    ]);
    assert_fails(&out, 1, "wrong passphrase");

    let out = ok(&cloakfs(&[
        "passwd",
        s(&f.cipher),
        "--passfile",
        s(&old),
        "--new-passfile",
        s(&new),
    ]));
    assert!(out.contains("no file was rewritten"), "{out}");
    let mut after = tree_hashes(&f.cipher);
    let conf_after = after.remove(Path::new("cloakfs.conf")).unwrap();
    assert_eq!(before, after, "a backing file changed");
    assert_ne!(conf_before, conf_after);
    assert!(!std::fs::read_dir(&f.cipher).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains(".tmp.")));

    assert_fails(
        &test_unlock(&f, &["--passfile", s(&old)]),
        1,
        "wrong passphrase",
    );
    let out = ok(&test_unlock(&f, &["--passfile", s(&new)]));
    // Same slot ID and label, same cost as before.
    assert!(
        out.contains("slot 1: passphrase (argon2id m=64 KiB t=1 p=1) label \"test\""),
        "{out}"
    );
    // The volume still decrypts with the new passphrase: same master key.
    let v =
        cloakfs_core::Volume::unlock(&conf, &Passphrase::new(b"a brand new passphrase".to_vec()))
            .unwrap();
    assert_eq!(
        v.root_dir_id().0,
        cloakfs_core::text::unb64_array::<16>("oKGio6SlpqeoqaqrrK2urw").unwrap()
    );
}

#[test]
fn passphrase_slots_add_list_test_remove() {
    let f = Fixture::new();
    let second = f.write_pass("second passphrase");
    let out = add(
        &f,
        &[
            "--new-passfile",
            s(&second),
            "--label",
            "spare",
            "--kdf-memory",
            "64",
            "--kdf-iterations",
            "1",
        ],
    );
    assert!(out.contains("Added key slot 2 (passphrase)"), "{out}");
    let l = list(&f);
    assert!(l.contains("slot 1: passphrase"), "{l}");
    assert!(
        l.contains("slot 2: passphrase (argon2id m=64 KiB t=1 p=1) label \"spare\""),
        "{l}"
    );
    assert!(ok(&test_unlock(&f, &["--passfile", s(&second)])).contains("slot 2"));
    assert!(ok(&test_unlock(&f, &["--passfile", s(&f.pass)])).contains("slot 1"));
    // --slot restricts which slot is tried.
    assert_fails(
        &test_unlock(&f, &["--passfile", s(&f.pass), "--slot", "2"]),
        1,
        "wrong passphrase",
    );
    assert_fails(
        &test_unlock(&f, &["--passfile", s(&f.pass), "--slot", "9"]),
        2,
        "no key slot 9",
    );

    // Removing the slot you unlocked with, when it is the only one your secret opens: refused.
    let out = cloakfs(&[
        "slots",
        "remove",
        s(&f.cipher),
        "1",
        "--passfile",
        s(&f.pass),
    ]);
    assert_fails(&out, 2, "refusing to remove key slot 1");
    // With the other slot's secret: done.
    ok(&cloakfs(&[
        "slots",
        "remove",
        s(&f.cipher),
        "1",
        "--passfile",
        s(&second),
    ]));
    assert_fails(&test_unlock(&f, &["--passfile", s(&f.pass)]), 1, "wrong");
    assert!(!list(&f).contains("slot 1"));
    // The last slot can never be removed.
    let out = cloakfs(&[
        "slots",
        "remove",
        s(&f.cipher),
        "2",
        "--passfile",
        s(&second),
    ]);
    assert_fails(&out, 2, "refusing to remove key slot 2");
    // Unknown slot, wrong secret.
    assert_fails(
        &cloakfs(&[
            "slots",
            "remove",
            s(&f.cipher),
            "7",
            "--passfile",
            s(&second),
        ]),
        2,
        "no key slot 7",
    );
    // A passwd through a slot of another kind is refused with a hint.
    let kf = file(&f, "kf", &[7u8; 64]);
    ok(&cloakfs(&[
        "slots",
        "add",
        s(&f.cipher),
        "--passfile",
        s(&second),
        "--keyfile",
        s(&kf),
    ]));
    let out = cloakfs(&[
        "passwd",
        s(&f.cipher),
        "--keyfile",
        s(&kf),
        "--new-passfile",
        s(&f.pass),
    ]);
    assert_fails(&out, 2, "not a passphrase slot");
}

#[test]
fn same_passphrase_in_two_slots_may_remove_either() {
    let f = Fixture::new();
    add(
        &f,
        &[
            "--new-passfile",
            s(&f.pass),
            "--kdf-memory",
            "64",
            "--kdf-iterations",
            "1",
        ],
    );
    // The caller proves slot 2 with the same secret, so slot 1 may go.
    ok(&cloakfs(&[
        "slots",
        "remove",
        s(&f.cipher),
        "1",
        "--passfile",
        s(&f.pass),
    ]));
    assert!(ok(&test_unlock(&f, &["--passfile", s(&f.pass)])).contains("slot 2"));
}

// ---------------------------------------------------------------------------------------------
// key files

#[test]
fn keyfile_slot_from_file_and_stdin() {
    let f = Fixture::new();
    let kf = file(&f, "key", &(0..=255u8).collect::<Vec<_>>());
    assert!(add(&f, &["--keyfile", s(&kf), "--label", "usb"]).contains("slot 2 (keyfile)"));
    assert!(list(&f).contains("slot 2: keyfile (HKDF-SHA256 of the key file) label \"usb\""));
    assert!(ok(&test_unlock(&f, &["--keyfile", s(&kf)])).contains("slot 2"));
    // "-" is standard input.
    let data = std::fs::read(&kf).unwrap();
    let out = cloakfs_stdin(&["slots", "test", s(&f.cipher), "--keyfile", "-"], &data);
    assert!(ok(&out).contains("slot 2"));
    // A new key file from standard input too.
    let out = cloakfs_stdin(
        &[
            "slots",
            "add",
            s(&f.cipher),
            "--passfile",
            s(&f.pass),
            "--keyfile",
            "-",
        ],
        &[9u8; 32],
    );
    assert!(ok(&out).contains("slot 3 (keyfile)"));
    let kf3 = file(&f, "key3", &[9u8; 32]);
    assert!(ok(&test_unlock(&f, &["--keyfile", s(&kf3)])).contains("slot 3"));

    // Wrong key file (one byte changed), missing key file, empty, too short for a new slot.
    let mut bad = data.clone();
    bad[100] ^= 1;
    let badf = file(&f, "bad", &bad);
    assert_fails(
        &test_unlock(&f, &["--keyfile", s(&badf)]),
        1,
        "wrong passphrase or key",
    );
    let missing = f.tmp.path().join("nope");
    assert_fails(
        &test_unlock(&f, &["--keyfile", s(&missing)]),
        5,
        "cannot read key file",
    );
    let empty = file(&f, "empty", b"");
    assert_fails(&test_unlock(&f, &["--keyfile", s(&empty)]), 2, "is empty");
    let short = file(&f, "short", b"tiny");
    let out = cloakfs(&[
        "slots",
        "add",
        s(&f.cipher),
        "--passfile",
        s(&f.pass),
        "--keyfile",
        s(&short),
    ]);
    assert_fails(&out, 2, "too short");
    // Two secrets from standard input at once.
    let out = cloakfs_stdin(
        &[
            "slots",
            "test",
            s(&f.cipher),
            "--keyfile",
            "-",
            "--passfile",
            "-",
        ],
        b"x",
    );
    assert_fails(&out, 2, "only one secret");
}

#[test]
fn keyfile_mounts_with_dash_o_keyfile() {
    let f = Fixture::new();
    let kf = file(&f, "key", &[42u8; 64]);
    add(&f, &["--keyfile", s(&kf)]);
    let out = cloakfs(&[
        "mount",
        "-o",
        &format!("keyfile={}", s(&kf)),
        s(&f.cipher),
        s(&f.mnt),
    ]);
    ok(&out);
    let m = MountGuard(f.mnt.clone());
    std::fs::write(f.mnt.join("x"), b"through a key file").unwrap();
    m.unmount();
    // And with --keyfile.
    let out = cloakfs(&["mount", "--keyfile", s(&kf), s(&f.cipher), s(&f.mnt)]);
    ok(&out);
    let m = MountGuard(f.mnt.clone());
    assert_eq!(
        std::fs::read(f.mnt.join("x")).unwrap(),
        b"through a key file"
    );
    m.unmount();
}

// ---------------------------------------------------------------------------------------------
// recovery keys

fn recovery_key_in(out: &str) -> String {
    out.lines()
        .map(str::trim)
        .find(|l| l.len() == 69 && l.split('-').count() == 14)
        .unwrap_or_else(|| panic!("no recovery key in {out}"))
        .to_string()
}

#[test]
fn recovery_key_is_shown_once_and_unlocks() {
    let f = Fixture::new();
    let out = add(&f, &["--recovery", "--label", "paper"]);
    assert!(out.contains("Added key slot 2 (recovery)"), "{out}");
    let key = recovery_key_in(&out);
    // Stored nowhere.
    let compact: String = key.chars().filter(|c| *c != '-').collect();
    assert!(!config_text(&f).contains(&compact[..20]));
    let rk = file(&f, "rk", format!("{key}\n").as_bytes());
    assert!(ok(&test_unlock(&f, &["--recovery-key-file", s(&rk)])).contains("slot 2: recovery"));
    // Typed sloppily: lower case, spaces instead of dashes.
    let sloppy = file(
        &f,
        "sloppy",
        key.to_lowercase().replace('-', " ").as_bytes(),
    );
    ok(&test_unlock(&f, &["--recovery-key-file", s(&sloppy)]));
    // A typo is caught by the checksum; a valid key of another slot is a wrong key.
    let mut typo: Vec<char> = key.chars().collect();
    typo[3] = if typo[3] == 'Z' { 'Y' } else { 'Z' };
    let typo = file(&f, "typo", typo.into_iter().collect::<String>().as_bytes());
    assert_fails(
        &test_unlock(&f, &["--recovery-key-file", s(&typo)]),
        1,
        "checksum mismatch",
    );
    let other = recovery_key_in(&add(&f, &["--recovery"]));
    ok(&cloakfs(&[
        "slots",
        "remove",
        s(&f.cipher),
        "3",
        "--passfile",
        s(&f.pass),
    ]));
    let otherf = file(&f, "other", other.as_bytes());
    assert_fails(
        &test_unlock(&f, &["--recovery-key-file", s(&otherf)]),
        1,
        "wrong passphrase or key",
    );
    let garbage = file(&f, "garbage", b"not a key");
    assert_fails(
        &test_unlock(&f, &["--recovery-key-file", s(&garbage)]),
        1,
        "invalid recovery key",
    );
    // A recovery key can replace a forgotten passphrase.
    let newpass = f.write_pass("after recovery");
    ok(&cloakfs(&[
        "slots",
        "add",
        s(&f.cipher),
        "--recovery-key-file",
        s(&rk),
        "--new-passfile",
        s(&newpass),
        "--kdf-memory",
        "64",
        "--kdf-iterations",
        "1",
    ]));
    ok(&test_unlock(&f, &["--passfile", s(&newpass)]));
}

// ---------------------------------------------------------------------------------------------
// age and ssh recipients

#[test]
fn age_x25519_recipient_made_by_age_keygen() {
    let f = Fixture::new();
    let id = f.tmp.path().join("id.txt");
    run_tool(Command::new(tool("age-keygen")).arg("-o").arg(&id));
    let public =
        String::from_utf8(run_tool(Command::new("age-keygen").arg("-y").arg(&id)).stdout).unwrap();
    let out = add(&f, &["--recipient", public.trim(), "--label", "laptop"]);
    assert!(out.contains("slot 2 (recipient)"), "{out}");
    assert!(list(&f).contains("slot 2: recipient (age to x25519) label \"laptop\""));
    assert!(ok(&test_unlock(&f, &["--identity", s(&id)])).contains("slot 2"));

    // Interoperable: the Debian age tool decrypts the stored KEK with the same identity.
    let ct = cloakfs_core::text::unb64(config_field(&f, "age").as_bytes()).unwrap();
    let ctf = file(&f, "kek.age", &ct);
    let kek = run_tool(Command::new("age").arg("-d").arg("-i").arg(&id).arg(&ctf)).stdout;
    assert_eq!(kek.len(), 32);

    // Another identity, a file that is no identity, a missing one.
    let other = f.tmp.path().join("other.txt");
    run_tool(Command::new("age-keygen").arg("-o").arg(&other));
    assert_fails(
        &test_unlock(&f, &["--identity", s(&other)]),
        1,
        "no key slot of this volume takes the secret",
    );
    let junk = file(&f, "junk", b"hello\n");
    assert_fails(
        &test_unlock(&f, &["--identity", s(&junk)]),
        1,
        "not an age identity file",
    );
    assert_fails(
        &test_unlock(&f, &["--identity", s(&f.tmp.path().join("none"))]),
        5,
        "cannot read identity file",
    );
    // Bad recipients are refused before anything is written.
    let out = cloakfs(&[
        "slots",
        "add",
        s(&f.cipher),
        "--passfile",
        s(&f.pass),
        "--recipient",
        "age1notarealkey",
    ]);
    assert_fails(&out, 2, "not a valid age X25519 key");
}

fn ssh_keygen(dir: &Path, name: &str, kind: &[&str], pass: &str) -> PathBuf {
    let p = dir.join(name);
    run_tool(
        Command::new(tool("ssh-keygen"))
            .args(kind)
            .args(["-q", "-N", pass, "-C", name, "-f"])
            .arg(&p),
    );
    p
}

#[test]
fn ssh_ed25519_and_rsa_recipients_from_a_file() {
    let f = Fixture::new();
    let ed = ssh_keygen(f.tmp.path(), "ed", &["-t", "ed25519"], "");
    let rsa = ssh_keygen(f.tmp.path(), "rsa", &["-t", "rsa", "-b", "2048"], "");
    let mut recipients = String::from("# two people\n");
    for k in [&ed, &rsa] {
        recipients.push_str(&std::fs::read_to_string(k.with_extension("pub")).unwrap());
    }
    let rf = file(&f, "recipients", recipients.as_bytes());
    add(&f, &["--recipient", s(&rf)]);
    assert!(list(&f).contains("recipient (age to ssh-ed25519,ssh-rsa)"));
    assert!(ok(&test_unlock(&f, &["--identity", s(&ed)])).contains("slot 2"));
    assert!(ok(&test_unlock(&f, &["--identity", s(&rsa)])).contains("slot 2"));
    // A key that is not a recipient; a passphrase-protected key without a terminal to ask on.
    let stranger = ssh_keygen(f.tmp.path(), "stranger", &["-t", "ed25519"], "");
    assert_fails(
        &test_unlock(&f, &["--identity", s(&stranger)]),
        1,
        "no key slot",
    );
    let locked = ssh_keygen(f.tmp.path(), "locked", &["-t", "ed25519"], "secret words");
    add(
        &f,
        &[
            "--recipient",
            &std::fs::read_to_string(locked.with_extension("pub")).unwrap(),
        ],
    );
    // setsid: no controlling terminal, even when the tests run in one.
    let out = Command::new(tool("setsid"))
        .args([
            "-w",
            BIN,
            "slots",
            "test",
            s(&f.cipher),
            "--identity",
            s(&locked),
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_fails(
        &out,
        2,
        "is protected by a passphrase and there is no terminal",
    );
    // An unsupported ssh key type is refused as a recipient.
    let ecdsa = ssh_keygen(f.tmp.path(), "ecdsa", &["-t", "ecdsa"], "");
    let out = cloakfs(&[
        "slots",
        "add",
        s(&f.cipher),
        "--passfile",
        s(&f.pass),
        "--recipient",
        s(&ecdsa.with_extension("pub")),
    ]);
    assert_fails(&out, 2, "not supported");
}

// ---------------------------------------------------------------------------------------------
// PKCS#11 (SoftHSM2)

struct SoftHsm {
    conf: PathBuf,
    pin: PathBuf,
}

const SOFTHSM: &str = "/usr/lib/softhsm/libsofthsm2.so";

fn softhsm(f: &Fixture, label: &str) -> SoftHsm {
    tool("softhsm2-util");
    assert!(
        Path::new(SOFTHSM).exists(),
        "{SOFTHSM} missing: install softhsm2"
    );
    let dir = f.tmp.path().join("tokens");
    std::fs::create_dir_all(&dir).unwrap();
    let conf = f.tmp.path().join("softhsm2.conf");
    std::fs::write(
        &conf,
        format!(
            "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
            dir.display()
        ),
    )
    .unwrap();
    run_tool(
        Command::new("softhsm2-util")
            .env("SOFTHSM2_CONF", &conf)
            .args(["--init-token", "--free", "--label", label])
            .args(["--pin", "123456", "--so-pin", "87654321"]),
    );
    let pin = file(f, "pin", b"123456\n");
    SoftHsm { conf, pin }
}

#[test]
fn pkcs11_slot_on_softhsm2() {
    let f = Fixture::new();
    let hsm = softhsm(&f, "cloakfs-card");
    let env = [("SOFTHSM2_CONF", hsm.conf.as_path())];
    let out = cloakfs_env(
        &[
            "slots",
            "add",
            s(&f.cipher),
            "--passfile",
            s(&f.pass),
            "--pkcs11-module",
            SOFTHSM,
            "--pkcs11-token",
            "cloakfs-card",
            "--pin-file",
            s(&hsm.pin),
            "--label",
            "card",
        ],
        &env,
    );
    assert!(ok(&out).contains("slot 2 (pkcs11)"));
    assert!(list(&f).contains("slot 2: pkcs11 (HMAC key on PKCS#11 token \"cloakfs-card\")"));
    let unlock = ["--pkcs11-module", SOFTHSM, "--pin-file", s(&hsm.pin)];
    let out = cloakfs_env(
        &[&["slots", "test", s(&f.cipher)], &unlock[..]].concat(),
        &env,
    );
    assert!(ok(&out).contains("slot 2: pkcs11"));

    // The key object on the token is sensitive and not extractable: its value cannot be read.
    check_token_key(&hsm, &config_field(&f, "pkcs11_object"));

    // Wrong PIN; a token that is not there; a module that does not exist; no PIN and no tty.
    let wrong = file(&f, "wrongpin", b"000000\n");
    let out = cloakfs_env(
        &[
            "slots",
            "test",
            s(&f.cipher),
            "--pkcs11-module",
            SOFTHSM,
            "--pin-file",
            s(&wrong),
        ],
        &env,
    );
    assert_fails(&out, 1, "wrong PIN for PKCS#11 token \"cloakfs-card\"");
    let out = cloakfs_env(
        &[
            &["slots", "test", s(&f.cipher), "--pkcs11-token", "absent"],
            &unlock[..],
        ]
        .concat(),
        &env,
    );
    assert_fails(&out, 5, "no PKCS#11 token labelled \"absent\" is present");
    let out = cloakfs_env(
        &[
            "slots",
            "test",
            s(&f.cipher),
            "--pkcs11-module",
            "/usr/lib/nothing/libnone.so",
            "--pin-file",
            s(&hsm.pin),
        ],
        &env,
    );
    assert_fails(
        &out,
        5,
        "PKCS#11 module /usr/lib/nothing/libnone.so does not exist",
    );
    // setsid: no controlling terminal to prompt on, even when the tests run in one.
    let out = Command::new(tool("setsid"))
        .args([
            "-w",
            BIN,
            "slots",
            "test",
            s(&f.cipher),
            "--pkcs11-module",
            SOFTHSM,
        ])
        .env("SOFTHSM2_CONF", &hsm.conf)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_fails(&out, 2, "cannot prompt for the PIN");
    // The token removed entirely (its directory emptied): a clear error, and the passphrase
    // still works.
    std::fs::remove_dir_all(f.tmp.path().join("tokens")).unwrap();
    std::fs::create_dir_all(f.tmp.path().join("tokens")).unwrap();
    let out = cloakfs_env(
        &[&["slots", "test", s(&f.cipher)], &unlock[..]].concat(),
        &env,
    );
    assert_fails(&out, 5, "no PKCS#11 token labelled \"cloakfs-card\"");
    ok(&test_unlock(&f, &["--passfile", s(&f.pass)]));
}

fn check_token_key(hsm: &SoftHsm, object: &str) {
    use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
    use cryptoki::object::{Attribute, AttributeType, ObjectClass};
    use cryptoki::session::UserType;
    // SOFTHSM2_CONF is read when the library initializes; this test process sets it only for
    // itself (each test runs the binary for everything else).
    std::env::set_var("SOFTHSM2_CONF", &hsm.conf);
    let ctx = Pkcs11::new(SOFTHSM).unwrap();
    ctx.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK))
        .unwrap();
    let slot = ctx.get_slots_with_token().unwrap()[0];
    let session = ctx.open_ro_session(slot).unwrap();
    session
        .login(UserType::User, Some(&"123456".into()))
        .unwrap();
    let keys = session
        .find_objects(&[
            Attribute::Class(ObjectClass::SECRET_KEY),
            Attribute::Label(object.as_bytes().to_vec()),
        ])
        .unwrap();
    assert_eq!(keys.len(), 1, "one key object labelled {object}");
    let attrs = session
        .get_attributes(
            keys[0],
            &[AttributeType::Sensitive, AttributeType::Extractable],
        )
        .unwrap();
    assert!(attrs.contains(&Attribute::Sensitive(true)), "{attrs:?}");
    assert!(attrs.contains(&Attribute::Extractable(false)), "{attrs:?}");
    assert!(session
        .get_attributes(keys[0], &[AttributeType::Value])
        .map(|v| v.is_empty())
        .unwrap_or(true));
}

// ---------------------------------------------------------------------------------------------
// GnuPG

#[test]
fn gpg_slot_through_gpg_agent() {
    let f = Fixture::new();
    let home = GnuPgHome::new(&["cloakfs test <cloakfs@example.org>"]);
    let env = [("GNUPGHOME", home.path())];
    let out = cloakfs_env(
        &[
            "slots",
            "add",
            s(&f.cipher),
            "--passfile",
            s(&f.pass),
            "--gpg-recipient",
            "cloakfs@example.org",
        ],
        &env,
    );
    assert!(ok(&out).contains("slot 2 (gpg)"));
    assert!(list(&f).contains("slot 2: gpg (gpg to cloakfs@example.org)"));
    let out = cloakfs_env(&["slots", "test", s(&f.cipher), "--gpg"], &env);
    assert!(ok(&out).contains("slot 2: gpg"));

    // Someone else's keyring: gpg cannot decrypt.
    let other = GnuPgHome::new(&[]);
    let out = cloakfs_env(
        &["slots", "test", s(&f.cipher), "--gpg"],
        &[("GNUPGHOME", other.path())],
    );
    assert_fails(&out, 1, "gpg could not decrypt key slot 2");
    // An unknown recipient is refused when adding.
    let out = cloakfs_env(
        &[
            "slots",
            "add",
            s(&f.cipher),
            "--passfile",
            s(&f.pass),
            "--gpg-recipient",
            "nobody@example.org",
        ],
        &env,
    );
    assert_fails(&out, 5, "gpg could not encrypt to nobody@example.org");
}

// ---------------------------------------------------------------------------------------------
// Shamir shares

fn share_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

fn with_shares(shares: &[&PathBuf]) -> Vec<String> {
    shares
        .iter()
        .flat_map(|p| ["--share".to_string(), s(p).to_string()])
        .collect()
}

fn test_shares(f: &Fixture, shares: &[&PathBuf]) -> Output {
    let args = with_shares(shares);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    test_unlock(f, &args)
}

#[test]
fn shamir_any_two_of_three() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new();
    let dir = f.tmp.path().join("shares");
    let out = add(
        &f,
        &[
            "--shamir",
            "2/3",
            "--share-dir",
            s(&dir),
            "--label",
            "board",
        ],
    );
    assert!(out.contains("slot 2 (shamir)"), "{out}");
    let sh = share_files(&dir);
    assert_eq!(sh.len(), 3, "{sh:?}");
    for p in &sh {
        assert_eq!(
            std::fs::metadata(p).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    assert!(list(&f).contains("slot 2: shamir (any 2 of 3 shares) label \"board\""));
    // The same as JSON, for scripts: parameters, never key material.
    let json: serde_json::Value =
        serde_json::from_str(&ok(&cloakfs(&["slots", "list", "--json", s(&f.cipher)]))).unwrap();
    let slots = json.as_array().unwrap();
    assert_eq!(slots.len(), 2, "{json}");
    assert_eq!(slots[0]["kind"], "passphrase");
    assert!(
        slots[0]["argon2id"]["memory_kib"].as_u64().unwrap() > 0,
        "{json}"
    );
    assert_eq!(slots[1]["id"], 2);
    assert_eq!(slots[1]["label"], "board");
    assert_eq!(
        (slots[1]["threshold"].clone(), slots[1]["shares"].clone()),
        (2.into(), 3.into())
    );
    let text = json.to_string();
    for secret in ["wrapped", "salt", "nonce", "mac"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    for pair in [[0, 1], [0, 2], [1, 2], [2, 0]] {
        let out = test_shares(&f, &[&sh[pair[0]], &sh[pair[1]]]);
        assert!(ok(&out).contains("slot 2: shamir"));
    }
    ok(&test_shares(&f, &[&sh[0], &sh[1], &sh[2]]));
    // Below the threshold, or the same share twice.
    assert_fails(
        &test_shares(&f, &[&sh[1]]),
        1,
        "1 distinct share(s) of slot 2 given, 2 needed",
    );
    assert_fails(
        &test_shares(&f, &[&sh[1], &sh[1]]),
        1,
        "1 distinct share(s) of slot 2 given, 2 needed",
    );
    // A damaged share.
    let text = std::fs::read_to_string(&sh[0]).unwrap();
    let pos = text.find("cloakfs-share:").unwrap() + 30;
    let mut b = text.into_bytes();
    b[pos] = if b[pos] == b'A' { b'B' } else { b'A' };
    let damaged = file(&f, "damaged", &b);
    assert_fails(
        &test_shares(&f, &[&damaged, &sh[1]]),
        1,
        "checksum mismatch",
    );
    // Shares of another volume mixed in.
    let g = Fixture::new();
    let gdir = g.tmp.path().join("shares");
    add(&g, &["--shamir", "2/3", "--share-dir", s(&gdir)]);
    let gsh = share_files(&gdir);
    assert_fails(
        &test_shares(&f, &[&sh[0], &gsh[1]]),
        1,
        "belongs to another volume",
    );
    // Shares of a removed slot.
    ok(&cloakfs(&[
        "slots",
        "remove",
        s(&f.cipher),
        "2",
        "--passfile",
        s(&f.pass),
    ]));
    assert_fails(
        &test_shares(&f, &[&sh[0], &sh[1]]),
        1,
        "no longer has as a shamir slot",
    );
    // Invalid schemes; existing share files are never overwritten.
    for bad in ["3/2", "0/3", "2/300", "two"] {
        let out = cloakfs(&[
            "slots",
            "add",
            s(&f.cipher),
            "--passfile",
            s(&f.pass),
            "--shamir",
            bad,
            "--share-dir",
            s(&dir),
        ]);
        assert_fails(&out, 2, "--shamir");
    }
}

#[test]
fn shamir_shares_encrypted_to_age_recipients() {
    let f = Fixture::new();
    let mut ids = Vec::new();
    let mut pubs = Vec::new();
    for i in 0..3 {
        let id = f.tmp.path().join(format!("id{i}"));
        run_tool(Command::new(tool("age-keygen")).arg("-o").arg(&id));
        let p = run_tool(Command::new("age-keygen").arg("-y").arg(&id)).stdout;
        pubs.push(String::from_utf8(p).unwrap().trim().to_string());
        ids.push(id);
    }
    let dir = f.tmp.path().join("shares");
    let mut args = vec!["--shamir", "2/3", "--share-dir", s(&dir)];
    for p in &pubs {
        args.push("--share-recipient");
        args.push(p);
    }
    add(&f, &args);
    let sh = share_files(&dir);
    assert!(
        sh.iter().all(|p| p.to_string_lossy().ends_with(".txt.age")),
        "{sh:?}"
    );
    // Each person decrypts their own share (age can, too) and two of them unlock.
    let plain = run_tool(
        Command::new("age")
            .arg("-d")
            .arg("-i")
            .arg(&ids[0])
            .arg(&sh[0]),
    )
    .stdout;
    assert!(String::from_utf8(plain).unwrap().contains("cloakfs-share:"));
    let out = test_unlock(
        &f,
        &[
            "--share",
            s(&sh[0]),
            "--share",
            s(&sh[2]),
            "--identity",
            s(&ids[0]),
            "--identity",
            s(&ids[2]),
        ],
    );
    assert!(ok(&out).contains("slot 2: shamir"));
    // Without the identity of one of them.
    let out = test_unlock(
        &f,
        &[
            "--share",
            s(&sh[0]),
            "--share",
            s(&sh[2]),
            "--identity",
            s(&ids[0]),
        ],
    );
    assert_fails(&out, 1, "none of the identities given decrypts it");
    // The number of recipients must match N.
    let out = cloakfs(&[
        "slots",
        "add",
        s(&f.cipher),
        "--passfile",
        s(&f.pass),
        "--shamir",
        "2/3",
        "--share-dir",
        s(&f.tmp.path().join("more")),
        "--share-recipient",
        &pubs[0],
    ]);
    assert_fails(&out, 2, "give one per share");
}

// ---------------------------------------------------------------------------------------------
// Unknown kinds, no stored key, damaged configs, crashes

#[test]
fn unknown_slot_kind_is_kept_listed_and_skipped() {
    let f = Fixture::new();
    // A newer cloakfs added a slot of a kind this one does not know.
    let mut c = VolumeConfig::load(&f.cipher).unwrap();
    let (mk, _) = c
        .unlock_passphrase(&Passphrase::new(PASS.as_bytes().to_vec()))
        .unwrap();
    let mut fields = cloakfs_core::text::Fields::new();
    fields.insert("credential".into(), "AAAA".into());
    c.add_slot(
        &mk,
        "fido2-hmac",
        "yubikey",
        fields,
        &Kek::random(),
        [3; 12],
    )
    .unwrap();
    c.seal(&mk);
    c.save(&f.cipher).unwrap();

    let l = list(&f);
    assert!(
        l.contains("slot 2: fido2-hmac (unknown kind (made by a newer cloakfs?)"),
        "{l}"
    );
    let info = ok(&cloakfs(&["info", s(&f.cipher)]));
    assert!(info.contains("slot 2: fido2-hmac (unknown kind"), "{info}");
    ok(&test_unlock(&f, &["--passfile", s(&f.pass)]));
    // Other changes keep it; it can be removed like any slot.
    let kf = file(&f, "kf", &[1u8; 32]);
    add(&f, &["--keyfile", s(&kf)]);
    assert!(list(&f).contains("slot 2: fido2-hmac"));
    ok(&cloakfs(&[
        "slots",
        "remove",
        s(&f.cipher),
        "2",
        "--passfile",
        s(&f.pass),
    ]));
    assert!(!list(&f).contains("fido2"));
}

#[test]
fn no_stored_key_volume() {
    let f = Fixture::bare();
    let out = f.init(&["--no-stored-key"]);
    let text = ok(&out);
    assert!(text.contains("No stored key"), "{text}");
    let conf = config_text(&f);
    assert!(conf.contains("\"key_source\": \"passphrase\""), "{conf}");
    assert!(!conf.contains("wrapped"), "{conf}");
    let info = ok(&cloakfs(&["info", s(&f.cipher)]));
    assert!(info.contains("key source:      no stored key"), "{info}");
    assert!(list(&f).contains("no stored key"));
    assert!(ok(&test_unlock(&f, &["--passfile", s(&f.pass)])).contains("no stored key"));
    let wrong = f.write_pass("not it");
    assert_fails(
        &test_unlock(&f, &["--passfile", s(&wrong)]),
        1,
        "wrong passphrase",
    );
    let kf = file(&f, "kf", &[1u8; 32]);
    assert_fails(
        &cloakfs(&[
            "slots",
            "add",
            s(&f.cipher),
            "--passfile",
            s(&f.pass),
            "--keyfile",
            s(&kf),
        ]),
        2,
        "no stored key",
    );
    assert_fails(
        &cloakfs(&[
            "passwd",
            s(&f.cipher),
            "--passfile",
            s(&f.pass),
            "--new-passfile",
            s(&wrong),
        ]),
        2,
        "no stored key",
    );
    assert_fails(&test_unlock(&f, &["--keyfile", s(&kf)]), 2, "no stored key");
    // It mounts like any volume.
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("f"), b"derived key").unwrap();
    m.unmount();
}

#[test]
fn damaged_or_tampered_config_is_refused_by_slot_commands() {
    let f = Fixture::new();
    let conf = f.cipher.join("cloakfs.conf");
    let good = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, "{ \"cloakfs\": 1, garbage").unwrap();
    let kf = file(&f, "kf", &[1u8; 32]);
    for args in [
        vec!["slots", "list", s(&f.cipher)],
        vec!["slots", "test", s(&f.cipher), "--passfile", s(&f.pass)],
        vec![
            "slots",
            "add",
            s(&f.cipher),
            "--passfile",
            s(&f.pass),
            "--keyfile",
            s(&kf),
        ],
        vec![
            "slots",
            "remove",
            s(&f.cipher),
            "1",
            "--passfile",
            s(&f.pass),
        ],
        vec![
            "passwd",
            s(&f.cipher),
            "--passfile",
            s(&f.pass),
            "--new-passfile",
            s(&kf),
        ],
    ] {
        assert_fails(&cloakfs(&args), 3, "damaged volume config");
    }
    // A volume parameter changed without the key: refused once a slot opens.
    std::fs::write(&conf, good.replace("\"sparse\"", "\"strict\"")).unwrap();
    let out = cloakfs(&[
        "slots",
        "add",
        s(&f.cipher),
        "--passfile",
        s(&f.pass),
        "--keyfile",
        s(&kf),
    ]);
    assert_fails(&out, 3, "MAC mismatch");
    // A slot's Argon2id cost raised: that slot no longer opens (it is in the wrap AAD).
    std::fs::write(
        &conf,
        good.replace(
            "\"argon2_iterations\": \"1\"",
            "\"argon2_iterations\": \"2\"",
        ),
    )
    .unwrap();
    assert_fails(
        &test_unlock(&f, &["--passfile", s(&f.pass)]),
        1,
        "wrong passphrase",
    );
    // An absurd cost is refused as damage, not computed.
    std::fs::write(
        &conf,
        good.replace(
            "\"argon2_memory_kib\": \"64\"",
            "\"argon2_memory_kib\": \"99999999999\"",
        ),
    )
    .unwrap();
    assert_fails(
        &test_unlock(&f, &["--passfile", s(&f.pass)]),
        3,
        "damaged volume config",
    );
}

/// What a crash during `slots add` can leave: a torn temporary file beside the config, or the
/// old config (the rename never happened). The old secret opens either; the new one opens once
/// the rename is done.
#[test]
fn crash_leftovers_of_a_slot_change() {
    let f = Fixture::new();
    let conf = f.cipher.join("cloakfs.conf");
    let old_config = std::fs::read(&conf).unwrap();
    let kf = file(&f, "kf", &[5u8; 48]);
    add(&f, &["--keyfile", s(&kf)]);
    let new_config = std::fs::read(&conf).unwrap();

    // Killed after writing part of the temporary file: the old config plus a torn tmp.
    std::fs::write(&conf, &old_config).unwrap();
    std::fs::write(
        f.cipher.join("cloakfs.conf.tmp.4242"),
        &new_config[..new_config.len() / 3],
    )
    .unwrap();
    ok(&test_unlock(&f, &["--passfile", s(&f.pass)]));
    assert_fails(&test_unlock(&f, &["--keyfile", s(&kf)]), 1, "no key slot");
    assert!(ok(&cloakfs(&["slots", "list", s(&f.cipher)])).contains("slot 1"));

    // Killed after the complete temporary file was synced but before the rename.
    std::fs::write(f.cipher.join("cloakfs.conf.tmp.4242"), &new_config).unwrap();
    ok(&test_unlock(&f, &["--passfile", s(&f.pass)]));

    // Killed after the rename: the new config, both secrets open.
    std::fs::rename(f.cipher.join("cloakfs.conf.tmp.4242"), &conf).unwrap();
    ok(&test_unlock(&f, &["--passfile", s(&f.pass)]));
    ok(&test_unlock(&f, &["--keyfile", s(&kf)]));
    // And changes go on working over any leftover.
    std::fs::write(f.cipher.join("cloakfs.conf.tmp.1"), b"junk").unwrap();
    add(&f, &["--recovery"]);
    assert!(list(&f).contains("slot 3: recovery"));
}

#[test]
fn secrets_of_a_kind_the_volume_lacks() {
    let f = Fixture::new();
    let kf = file(&f, "kf", &[1u8; 32]);
    add(&f, &["--keyfile", s(&kf)]);
    ok(&cloakfs(&[
        "slots",
        "remove",
        s(&f.cipher),
        "1",
        "--keyfile",
        s(&kf),
    ]));
    // Only a key-file slot is left: no passphrase to prompt for.
    assert_fails(&test_unlock(&f, &[]), 1, "no passphrase slot to prompt for");
    assert_fails(
        &test_unlock(&f, &["--passfile", s(&f.pass)]),
        1,
        "no key slot",
    );
    assert_fails(&test_unlock(&f, &["--gpg"]), 1, "no key slot");
    let rk = file(
        &f,
        "rk",
        b"G20R-50W4-GP38-F249-HA5R-S3CE-HY89-34MK-JJAS-D5WR-K6D9-Q74X-KTFX-4SZ1",
    );
    assert_fails(
        &test_unlock(&f, &["--recovery-key-file", s(&rk)]),
        1,
        "no key slot",
    );
    // Adding needs exactly one new secret (clap's usage error).
    let out = cloakfs(&["slots", "add", s(&f.cipher), "--unlock-keyfile", s(&kf)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = cloakfs(&[
        "slots",
        "add",
        s(&f.cipher),
        "--unlock-keyfile",
        s(&kf),
        "--recovery",
        "--keyfile",
        s(&kf),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = cloakfs(&[
        "slots",
        "add",
        s(&f.cipher),
        "--unlock-keyfile",
        s(&kf),
        "--recovery",
    ]);
    assert!(ok(&out).contains("slot 3 (recovery)"));
}

// ---------------------------------------------------------------------------------------------
// Key pinning: a config replaced by someone who can write the cipher directory

/// The attacker's config: a volume with the attacker's own master key, whose one slot opens
/// with what the victim holds (built by the attacker with public information only), and the
/// victim's volume ID (so only the key tells it apart) or a fresh one.
fn forged_config(
    victim: &Fixture,
    keep_volume_id: bool,
    kind: &str,
    fields: cloakfs_core::text::Fields,
    kek: &cloakfs_core::slots::Kek,
) -> String {
    use cloakfs_core::crypto::keys::MasterKey;
    use cloakfs_core::format::config::{VolumeConfig, VolumeParams};
    let mut params = VolumeParams::new();
    if keep_volume_id {
        params.volume_id = VolumeConfig::load(&victim.cipher).unwrap().params.volume_id;
    }
    let mk = MasterKey::generate();
    let mut c = VolumeConfig::new(params);
    c.add_slot(
        &mk,
        kind,
        "",
        fields,
        kek,
        cloakfs_core::crypto::random::array(),
    )
    .unwrap();
    c.seal(&mk);
    c.to_json()
}

fn plant_config(victim: &Fixture, json: &str) {
    std::fs::write(victim.cipher.join("cloakfs.conf"), json).unwrap();
}

/// Every command that unlocks refuses the volume with exit 3 and one line.
fn refused_everywhere(f: &Fixture, unlock: &[&str], env: &[(&str, &Path)]) {
    let c = s(&f.cipher);
    let mnt = s(&f.mnt);
    let commands: Vec<Vec<&str>> = vec![
        vec!["mount", c, mnt],
        vec!["cat", c, "secret.txt"],
        vec!["fsck", c],
        vec!["export", c, "/nonexistent-export-dest"],
        vec!["name", c, "secret.txt"],
        vec!["slots", "test", c],
    ];
    for args in commands {
        let mut cmd = f.bin();
        cmd.args([&args[..], unlock].concat()).stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        // Unmounted before any assertion, so a failing test leaves no mount behind.
        let mounted = is_mounted(&f.mnt);
        drop(MountGuard(f.mnt.clone()));
        assert!(!mounted, "{args:?} mounted the forged volume");
        assert_fails(&out, 3, "may have been replaced");
    }
}

/// The volume of `f` seen from another machine: its own record of known volumes.
fn on_another_machine(f: &Fixture) -> Fixture {
    let mut o = Fixture::bare();
    o.cipher = f.cipher.clone();
    o.pass = f.pass.clone();
    o.state = o.tmp.path().join("other-machine");
    o
}

/// Gives the victim's volume a recipient slot for `public`, opens it once with `unlock`, then
/// plants the attacker's configs (the attacker's own volume with the same recipient: what
/// `cloakfs init` + `cloakfs slots add --recipient` make), with a fresh volume ID and with
/// the victim's, and checks that each is refused.
fn forged_recipient_configs_are_refused(f: &Fixture, public: &str, unlock: &[&str]) {
    ok(&f.run(&[
        "slots",
        "add",
        s(&f.cipher),
        "--passfile",
        s(&f.pass),
        "--recipient",
        public,
    ]));
    ok(&f.run(&[&["slots", "test", s(&f.cipher)], unlock].concat()));
    let recipients = cloakfs_core::slots::recipient::Recipients::parse(public).unwrap();
    let original = config_text(f);
    for keep_id in [false, true] {
        let (fields, kek) = cloakfs_core::slots::recipient::new_slot(&recipients, false).unwrap();
        plant_config(f, &forged_config(f, keep_id, "recipient", fields, &kek));
        refused_everywhere(f, unlock, &[]);
    }
    plant_config(f, &original);
}

#[test]
fn replaced_config_with_an_age_recipient_is_refused_after_first_use() {
    let f = Fixture::new();
    let id = f.tmp.path().join("victim.key");
    run_tool(Command::new(tool("age-keygen")).arg("-o").arg(&id));
    let public =
        String::from_utf8(run_tool(Command::new("age-keygen").arg("-y").arg(&id)).stdout).unwrap();
    let unlock = ["--identity", s(&id)];
    forged_recipient_configs_are_refused(&f, public.trim(), &unlock);
    // On a machine that never opened the volume, the first unlock shows the fingerprint...
    let fresh = on_another_machine(&f);
    let test = [&["slots", "test", s(&f.cipher)], &unlock[..]].concat();
    let out = fresh.run(&test);
    let err = stderr(&out);
    ok(&out);
    let record = cloakfs_core::known_volumes::KnownVolumes::at(&fresh.state)
        .list()
        .unwrap();
    assert_eq!(record.len(), 1);
    assert!(
        err.contains("first use of volume")
            && err.contains(&format!("fingerprint is {}", record[0].fingerprint)),
        "{err}"
    );
    // ... and only the first.
    let out = fresh.run(&test);
    ok(&out);
    assert!(!stderr(&out).contains("first use"));
}

#[test]
fn replaced_config_with_an_ssh_recipient_is_refused() {
    let f = Fixture::new();
    let key = ssh_keygen(f.tmp.path(), "victim", &["-t", "ed25519"], "");
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    forged_recipient_configs_are_refused(&f, public.trim(), &["--identity", s(&key)]);
}

#[test]
fn a_gpg_slot_opens_only_by_public_key_decryption() {
    let f = Fixture::new();
    let home = GnuPgHome::new(&["cloakfs victim <victim@example.org>"]);
    let env = [("GNUPGHOME", home.path())];
    ok(&cloakfs_env(
        &[
            "slots",
            "add",
            s(&f.cipher),
            "--passfile",
            s(&f.pass),
            "--gpg-recipient",
            "victim@example.org",
        ],
        &env,
    ));
    // The attacker has no key at all: the "encrypted" KEK is an unencrypted literal packet
    // (`gpg --store`), which `gpg --decrypt` prints with exit 0.
    let kek = cloakfs_core::slots::Kek::random();
    let plain = file(&f, "kek.bin", kek.expose());
    let packet = f.tmp.path().join("kek.pgp");
    run_tool(
        Command::new("gpg")
            .env("GNUPGHOME", home.path())
            .args(["--batch", "--yes", "--store", "--output"])
            .arg(&packet)
            .arg(&plain),
    );
    let mut fields = cloakfs_core::text::Fields::new();
    fields.insert("gpg_recipients".into(), "victim@example.org".into());
    fields.insert(
        "gpg".into(),
        cloakfs_core::text::b64(&std::fs::read(&packet).unwrap()),
    );
    plant_config(&f, &forged_config(&f, true, "gpg", fields, &kek));
    // Refused even on a machine that never opened the volume: nothing was decrypted.
    let fresh = on_another_machine(&f);
    for who in [&f, &fresh] {
        let mut cmd = who.bin();
        cmd.args(["slots", "test", s(&f.cipher), "--gpg"])
            .env("GNUPGHOME", home.path())
            .stdin(Stdio::null());
        assert_fails(
            &cmd.output().unwrap(),
            3,
            "not encrypted to a key in your keyring",
        );
    }
    assert!(!fresh.state.join("known_volumes.json").exists());
    // A real public-key encryption to the victim (anyone can make one: the key is public) is
    // a config replacement that pinning catches.
    let enc = f.tmp.path().join("kek.gpg");
    run_tool(
        Command::new("gpg")
            .env("GNUPGHOME", home.path())
            .args(["--batch", "--yes", "--trust-model", "always", "--encrypt"])
            .args(["--recipient", "victim@example.org", "--output"])
            .arg(&enc)
            .arg(&plain),
    );
    let mut fields = cloakfs_core::text::Fields::new();
    fields.insert("gpg_recipients".into(), "victim@example.org".into());
    fields.insert(
        "gpg".into(),
        cloakfs_core::text::b64(&std::fs::read(&enc).unwrap()),
    );
    plant_config(&f, &forged_config(&f, true, "gpg", fields, &kek));
    refused_everywhere(&f, &["--gpg"], &env);
}

#[test]
fn a_volume_rekeyed_elsewhere_is_accepted_only_when_asked() {
    let f = Fixture::new();
    let other = on_another_machine(&f);
    ok(&other.run(&["rekey", "--passfile", s(&f.pass), s(&f.cipher)]));
    let out = f.run(&["slots", "test", "--passfile", s(&f.pass), s(&f.cipher)]);
    assert_fails(&out, 3, "cloakfs known accept");
    let new_fp = cloakfs_core::known_volumes::KnownVolumes::at(&other.state)
        .list()
        .unwrap()[0]
        .fingerprint
        .to_string();
    let accept = |extra: &[&str]| {
        f.run(
            &[
                &["known", "accept", "--passfile", s(&f.pass)],
                extra,
                &[s(&f.cipher)],
            ]
            .concat(),
        )
    };
    // No terminal and no fingerprint: refused; a wrong or malformed one: refused.
    assert_fails(&accept(&[]), 2, "--fingerprint");
    let wrong = "A".repeat(43);
    assert_fails(&accept(&["--fingerprint", &wrong]), 3, "not to");
    assert_fails(
        &accept(&["--fingerprint", "nonsense"]),
        2,
        "not a key fingerprint",
    );
    // A fingerprint is base64url, so one in 64 starts with '-': still a value, not an option.
    let dashed = format!("-{}", &wrong[1..]);
    assert_fails(&accept(&["--fingerprint", &dashed]), 3, "not to");
    assert_fails(
        &f.run(&["slots", "test", "--passfile", s(&f.pass), s(&f.cipher)]),
        3,
        "may have been replaced",
    );
    let out = ok(&accept(&["--fingerprint", &new_fp]));
    assert!(out.contains("Remembered"), "{out}");
    ok(&f.run(&["slots", "test", "--passfile", s(&f.pass), s(&f.cipher)]));
    // What info and list show.
    let info = ok(&f.run(&["info", s(&f.cipher)]));
    assert!(
        info.contains(&format!("this machine remembers {new_fp}")),
        "{info}"
    );
    let list = ok(&f.run(&["known", "list", "--json"]));
    assert!(list.contains(&new_fp), "{list}");
    // Forget it: the next unlock is a first use again.
    ok(&f.run(&["known", "forget", s(&f.cipher)]));
    let out = f.run(&["slots", "test", "--passfile", s(&f.pass), s(&f.cipher)]);
    ok(&out);
    assert!(stderr(&out).contains("first use"));
    assert_fails(
        &f.run(&["known", "forget", "/nonexistent-volume-dir"]),
        2,
        "give a cipher directory or a volume ID",
    );
}

#[test]
fn a_new_volume_in_a_known_directory_is_refused_until_accepted() {
    let f = Fixture::new();
    // The volume is removed and another one made in its place by someone else (another
    // machine): this machine still remembers the first one there.
    std::fs::remove_dir_all(&f.cipher).unwrap();
    let other = on_another_machine(&f);
    assert!(other.init(&[]).status.success());
    let out = f.run(&["slots", "test", "--passfile", s(&f.pass), s(&f.cipher)]);
    assert_fails(&out, 3, "held volume");
    // A volume made here with `init` is trusted here.
    std::fs::remove_dir_all(&f.cipher).unwrap();
    assert!(f.init(&[]).status.success());
    ok(&f.run(&["slots", "test", "--passfile", s(&f.pass), s(&f.cipher)]));
}

/// Makes a volume of the attacker's in `dir`, with the victim's passphrase, on the attacker's
/// own machine; returns its master-key fingerprint. (What matters to pinning is only that the
/// victim's secret opens it; a recipient slot makes that possible without the passphrase.)
fn attackers_volume(victim: &Fixture, dir: &Path) -> String {
    let mut a = Fixture::bare();
    a.cipher = dir.to_path_buf();
    a.pass = victim.pass.clone();
    a.state = a.tmp.path().join("attackers-machine");
    ok(&a.init(&[]));
    cloakfs_core::known_volumes::KnownVolumes::at(&a.state)
        .list()
        .unwrap()[0]
        .fingerprint
        .to_string()
}

/// Mounts `f` and asserts the mount is refused with exit 3 and one line containing `needle`.
fn mount_refused(f: &Fixture, needle: &str) {
    let out = f.mount(&[]);
    // Unmounted before any assertion, so a failing test leaves no mount behind.
    let mounted = is_mounted(&f.mnt);
    drop(MountGuard(f.mnt.clone()));
    assert!(!mounted, "the substituted volume was mounted");
    assert_fails(&out, 3, needle);
}

/// A fixture on a machine of its own (its own record of known volumes).
fn on_a_machine_of_its_own() -> Fixture {
    let mut f = Fixture::bare();
    f.state = f.tmp.path().join("machine");
    f
}

#[test]
fn a_symlink_planted_where_a_volume_was_is_refused() {
    // The reported attack, by whoever writes the cipher directory's parent (an NFS, sshfs or
    // SMB server): the volume moved aside, a volume of the attacker's in a new directory,
    // and a symlink to it under the volume's name.
    let f = on_a_machine_of_its_own();
    ok(&f.init(&[]));
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("secret.txt"), "mine").unwrap();
    m.unmount();
    std::fs::rename(&f.cipher, f.tmp.path().join("cipher.real")).unwrap();
    let forged = f.tmp.path().join("cipher2");
    attackers_volume(&f, &forged);
    std::os::unix::fs::symlink(&forged, &f.cipher).unwrap();
    mount_refused(&f, "held volume");
    // Each unlocking command refuses it the same way; `known accept` takes it on purpose.
    assert_fails(
        &f.run(&["slots", "test", "--passfile", s(&f.pass), s(&f.cipher)]),
        3,
        "cloakfs known accept",
    );
}

#[test]
fn a_volume_opened_through_a_symlink_stays_pinned_when_the_symlink_is_re_pointed() {
    let mut f = on_a_machine_of_its_own();
    let store = f.tmp.path().join("store");
    std::fs::create_dir(&store).unwrap();
    // The volume was made elsewhere; this machine first opens it through a symlink.
    let real = store.join("vault.v1");
    attackers_volume(&f, &real);
    f.cipher = store.join("vault");
    std::os::unix::fs::symlink("vault.v1", &f.cipher).unwrap();
    let out = f.mount(&[]);
    drop(MountGuard(f.mnt.clone()));
    assert!(stderr(&out).contains("first use"), "{}", stderr(&out));
    ok(&out);
    // The symlink re-pointed to another volume.
    attackers_volume(&f, &store.join("vault.v2"));
    std::fs::remove_file(&f.cipher).unwrap();
    std::os::unix::fs::symlink("vault.v2", &f.cipher).unwrap();
    mount_refused(&f, "held volume");
}

#[test]
fn entries_renamed_aside_under_a_replaced_config_are_refused_at_first_use() {
    // Where pinning cannot act (a machine that never opened the volume), the attacker
    // replaces the config and renames the old entries to dot-names, which a listing skips:
    // the volume would look empty and working.
    let f = on_a_machine_of_its_own();
    ok(&f.init(&[]));
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("secret.txt"), "mine").unwrap();
    std::fs::create_dir(f.mnt.join("photos")).unwrap();
    m.unmount();
    let forged = f.tmp.path().join("forged");
    let fp = attackers_volume(&f, &forged);
    std::fs::copy(forged.join("cloakfs.conf"), f.cipher.join("cloakfs.conf")).unwrap();
    for e in std::fs::read_dir(&f.cipher).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if !name.starts_with("cloakfs.") {
            std::fs::rename(f.cipher.join(&name), f.cipher.join(format!(".{name}"))).unwrap();
        }
    }
    let mut fresh = on_another_machine(&f);
    fresh.state = fresh.tmp.path().join("fresh-machine");
    mount_refused(&fresh, "2 entries that are not this volume's");
    assert!(!fresh.state.join("known_volumes.json").exists());
    // Accepted deliberately, it mounts.
    let accept = [
        "known",
        "accept",
        "--passfile",
        s(&f.pass),
        "--fingerprint",
        &fp,
    ];
    let out = ok(&fresh.run(&[&accept[..], &[s(&f.cipher)]].concat()));
    assert!(out.contains("not this volume's"), "{out}");
    fresh.mounted(&[]).unmount();
    // With an entry of the attacker's own beside them, the first use says what it saw.
    let mut attacker = on_another_machine(&f);
    attacker.cipher = forged.clone();
    let m = attacker.mounted(&[]);
    std::fs::write(attacker.mnt.join("README"), "hello").unwrap();
    m.unmount();
    for e in std::fs::read_dir(&forged).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if !name.starts_with("cloakfs.") {
            std::fs::rename(forged.join(&name), f.cipher.join(&name)).unwrap();
        }
    }
    let mut third = on_another_machine(&f);
    third.state = third.tmp.path().join("third-machine");
    let out = third.mount(&[]);
    drop(MountGuard(third.mnt.clone()));
    ok(&out);
    assert!(
        stderr(&out).contains("warning: the root of volume")
            && stderr(&out).contains("2 entries that are not this volume's"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_new_volume_in_a_sync_folder_opens_on_a_second_machine() {
    // What Syncthing keeps in the folder it syncs is no sign of a replaced config: an empty
    // volume whose root holds only that opens on another machine without being accepted.
    let f = on_a_machine_of_its_own();
    ok(&f.init(&[]));
    std::fs::create_dir(f.cipher.join(".stfolder")).unwrap();
    std::fs::write(f.cipher.join(".stignore"), "").unwrap();
    let mut second = on_another_machine(&f);
    second.state = second.tmp.path().join("second-machine");
    let out = second.mount(&[]);
    drop(MountGuard(second.mnt.clone()));
    ok(&out);
    assert!(
        !stderr(&out).contains("not this volume's"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn another_known_volumes_config_copied_over_a_private_one_is_refused() {
    // Issue 44: the user opened a team volume on this machine too; a member copies its
    // config over the user's private volume, so new files would be under a key they know.
    let private = on_a_machine_of_its_own();
    ok(&private.init(&[]));
    let mut team = Fixture::bare();
    team.state = private.state.clone();
    ok(&team.init(&[]));
    std::fs::copy(
        team.cipher.join("cloakfs.conf"),
        private.cipher.join("cloakfs.conf"),
    )
    .unwrap();
    mount_refused(&private, "held volume");
    // The team volume still opens where it is.
    ok(&team.run(&[
        "slots",
        "test",
        "--passfile",
        s(&team.pass),
        s(&team.cipher),
    ]));
}
