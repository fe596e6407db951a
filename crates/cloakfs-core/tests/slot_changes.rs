//! Key-slot changes on disk: crash safety of the atomic config replacement, and volumes
//! without a stored key.

use cloakfs_core::crypto::kdf::Argon2Params;
use cloakfs_core::crypto::secret::Passphrase;
use cloakfs_core::format::config::{VolumeConfig, VolumeParams, CONFIG_FILE};
use cloakfs_core::slots::{kind, passphrase, Kek, SlotRandomness};
use cloakfs_core::{Error, Volume};
use std::fs;
use std::path::{Path, PathBuf};

fn pass(p: &str) -> Passphrase {
    Passphrase::new(p.as_bytes().to_vec())
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn opens(dir: &Path, p: &str) -> bool {
    match Volume::unlock(dir, &pass(p)) {
        Ok(_) => true,
        Err(Error::WrongSecret) => false,
        Err(e) => panic!("{}: unexpected {e}", dir.display()),
    }
}

/// Changes the passphrase (replaces the slot in place) and captures the cipher directory after
/// every step of the atomic save: each capture is what a crash (or power cut, given the fsyncs)
/// at that moment leaves. Each must open with the old or the new passphrase, and never with
/// neither.
#[test]
fn a_crash_at_any_step_of_a_slot_change_leaves_old_or_new() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("vol");
    Volume::create(
        &dir,
        VolumeParams::new(),
        &pass("old secret"),
        Argon2Params::LEAST,
    )
    .unwrap();
    let mut config = VolumeConfig::load(&dir).unwrap();
    let (mk, id) = config.unlock_passphrase(&pass("old secret")).unwrap();
    let rnd = SlotRandomness::fresh();
    let (fields, kek) =
        passphrase::new_slot(&pass("new secret"), Argon2Params::LEAST, &rnd.salt).unwrap();
    config
        .replace_slot(id, &mk, kind::PASSPHRASE, "", fields, &kek, rnd.nonce)
        .unwrap();
    config.seal(&mk);

    let mut snaps: Vec<(String, PathBuf)> = Vec::new();
    let snap_root = tmp.path().join("snaps");
    config
        .save_observed(&dir, &mut |step| {
            let to = snap_root.join(format!("{}-{step}", snaps.len()));
            copy_dir(&dir, &to);
            snaps.push((step.to_string(), to));
        })
        .unwrap();
    let steps: Vec<&str> = snaps.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        steps,
        ["created", "written", "synced", "renamed", "dir-synced"]
    );
    for (step, snap) in &snaps {
        let old = opens(snap, "old secret");
        let new = opens(snap, "new secret");
        let renamed = matches!(step.as_str(), "renamed" | "dir-synced");
        assert_eq!((old, new), (!renamed, renamed), "after step {step}");
        // A leftover temporary file is an internal name: it never breaks the volume, and the
        // next change still works.
        let mut c = VolumeConfig::load(snap).unwrap();
        let (mk2, _) = c
            .unlock_passphrase(&pass(if renamed { "new secret" } else { "old secret" }))
            .unwrap();
        c.add_slot(
            &mk2,
            kind::KEYFILE,
            "",
            Default::default(),
            &Kek::random(),
            [0; 12],
        )
        .unwrap();
        c.seal(&mk2);
        c.save(snap).unwrap();
        assert_eq!(VolumeConfig::load(snap).unwrap().slots().len(), 2);
    }
    // The crash left no temporary file in the real directory.
    let names: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [CONFIG_FILE]);
}

/// A torn write of the temporary file (a crash before its fsync completed) leaves the old
/// config in place; a stale temporary file with our own PID is replaced, not an error.
#[test]
fn torn_temporary_file_and_stale_tmp_of_our_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("vol");
    Volume::create(&dir, VolumeParams::new(), &pass("pw"), Argon2Params::LEAST).unwrap();
    let good = fs::read_to_string(dir.join(CONFIG_FILE)).unwrap();
    let stale = dir.join(format!("{CONFIG_FILE}.tmp.{}", std::process::id()));
    fs::write(&stale, &good[..good.len() / 2]).unwrap();
    assert!(opens(&dir, "pw"));
    let mut c = VolumeConfig::load(&dir).unwrap();
    let (mk, _) = c.unlock_passphrase(&pass("pw")).unwrap();
    c.add_passphrase_slot(
        &mk,
        &pass("second"),
        Argon2Params::LEAST,
        "",
        SlotRandomness::fresh(),
    )
    .unwrap();
    c.seal(&mk);
    c.save(&dir).unwrap();
    assert!(!stale.exists());
    assert!(opens(&dir, "pw") && opens(&dir, "second"));
}

#[test]
fn no_stored_key_volume() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("vol");
    let v = Volume::create_no_stored_key(
        &dir,
        VolumeParams::new(),
        &pass("only key"),
        Argon2Params::LEAST,
    )
    .unwrap();
    let text = fs::read_to_string(dir.join(CONFIG_FILE)).unwrap();
    assert!(text.contains("\"key_source\": \"passphrase\""), "{text}");
    assert!(text.contains("\"slots\": []"), "{text}");
    let c = VolumeConfig::load(&dir).unwrap();
    assert!(!c.has_stored_key());
    let (mk, id) = c.unlock_passphrase(&pass("only key")).unwrap();
    assert_eq!(id, 0);
    // The master key is Argon2id(passphrase, salt) itself.
    let cloakfs_core::format::config::KeySource::Passphrase { kdf, salt } = c.key_source().clone()
    else {
        panic!("key source")
    };
    let direct = cloakfs_core::crypto::kdf::derive(&pass("only key"), &salt, &kdf).unwrap();
    assert_eq!(direct.expose(), mk.expose());
    assert_eq!(
        v.root_dir_id().0,
        Volume::unlock(&dir, &pass("only key"))
            .unwrap()
            .root_dir_id()
            .0
    );
    // A wrong passphrase is a MAC mismatch, reported as a wrong passphrase.
    assert!(matches!(
        Volume::unlock(&dir, &pass("wrong")),
        Err(Error::WrongSecret)
    ));
    // No slot can be added, and slot-based unlocking is refused.
    let mut c2 = c.clone();
    assert!(c2
        .add_slot(
            &mk,
            kind::KEYFILE,
            "",
            Default::default(),
            &Kek::random(),
            [0; 12]
        )
        .is_err());
    assert!(matches!(
        c.unlock_with(|_| -> cloakfs_core::Result<Option<Kek>> { Ok(None) }),
        Err(Error::NoUsableSlot(_))
    ));
    // Changed parameters are covered by the MAC: the derived key no longer verifies.
    let edited = text.replace(
        "\"argon2_iterations\": \"1\"",
        "\"argon2_iterations\": \"2\"",
    );
    let c3 = VolumeConfig::parse(&edited).unwrap();
    assert!(c3.unlock_passphrase(&pass("only key")).is_err());
    // A no-stored-key config with slots is damaged.
    let with_slot = text.replace(
        "\"slots\": []",
        "\"slots\": [{\"id\": \"1\", \"kind\": \"keyfile\"}]",
    );
    assert!(matches!(
        VolumeConfig::parse(&with_slot),
        Err(Error::ConfigDamaged(_))
    ));
    let unknown = text.replace("\"key_source\": \"passphrase\"", "\"key_source\": \"tpm\"");
    assert!(matches!(
        VolumeConfig::parse(&unknown),
        Err(Error::ConfigDamaged(_))
    ));
}
