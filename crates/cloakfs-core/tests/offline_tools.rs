//! The offline tools' engines on real cipher directories built with the core APIs (no mount):
//! walker, path translation both ways, fsck (detection and repair), export and rekey.

use cloakfs_core::crypto::kdf::Argon2Params;
use cloakfs_core::crypto::secret::Passphrase;
use cloakfs_core::format::config::VolumeParams;
use cloakfs_core::tools::fsck::{self, Options, ProblemKind};
use cloakfs_core::tools::translate;
use cloakfs_core::tools::walk::{self, Item, NoProgress};
use cloakfs_core::tools::writer::Writer;
use cloakfs_core::tools::{mounts, rekey};
use cloakfs_core::Volume;
use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

fn pass() -> Passphrase {
    Passphrase::new(b"offline tools".to_vec())
}

fn long_name() -> String {
    "long-name-".repeat(20)
}

/// A volume with a little of everything; returns the temp dir, the cipher dir and the
/// plaintext files with their contents.
fn build() -> (tempfile::TempDir, PathBuf, BTreeMap<PathBuf, Vec<u8>>) {
    let tmp = tempfile::tempdir().unwrap();
    let c = tmp.path().join("cipher");
    let v = Volume::create(&c, VolumeParams::new(), &pass(), Argon2Params::LEAST).unwrap();
    let w = Writer::new(&v, &c);
    let mut files = BTreeMap::new();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 253) as u8).collect();
    w.mkdir_all(Path::new("docs/deep/er")).unwrap();
    w.mkdir(Path::new("empty")).unwrap();
    for (p, d) in [
        ("hello.txt", b"hello world\n".to_vec()),
        ("docs/big.bin", big),
        ("docs/deep/er/x", vec![1u8; 4096]),
        ("zero", Vec::new()),
    ] {
        w.write_file(Path::new(p), &d).unwrap();
        files.insert(PathBuf::from(p), d);
    }
    let ln = PathBuf::from("docs").join(long_name());
    w.write_file(&ln, b"behind a long name").unwrap();
    files.insert(ln, b"behind a long name".to_vec());
    w.symlink(Path::new("docs/link"), b"deep/er/x").unwrap();
    w.symlink(Path::new("up"), b"docs/../hello.txt").unwrap();
    w.mkfifo(Path::new("pipe")).unwrap();
    w.hard_link(Path::new("hello.txt"), Path::new("docs/hello-again"))
        .unwrap();
    files.insert(PathBuf::from("docs/hello-again"), b"hello world\n".to_vec());
    let _ = w.set_xattr(Path::new("hello.txt"), b"user.note", b"a note");
    (tmp, c, files)
}

fn unlock(c: &Path) -> Volume {
    Volume::unlock(c, &pass()).unwrap()
}

fn read_plain(v: &Volume, c: &Path, p: &Path) -> Vec<u8> {
    let b = translate::lookup(v, c, p, true).unwrap();
    let r = cloakfs_core::tools::blocks::BlockReader::open(
        v.content(),
        std::fs::File::open(b).unwrap(),
    )
    .unwrap();
    let (mut out, mut all, mut sealed) = (Vec::new(), Vec::new(), Vec::new());
    let mut first = 0;
    while first < r.block_count() {
        let ch = r.read_chunk(first, 100, &mut out, &mut sealed).unwrap();
        assert_eq!(ch.first_failure(), None);
        all.extend_from_slice(&out);
        first += ch.states.len() as u64;
    }
    all
}

#[test]
fn walker_sees_every_entry_with_its_plaintext_path() {
    let (_t, c, files) = build();
    let v = unlock(&c);
    let paths = walk::plain_paths(&v, &c).unwrap();
    for p in files.keys() {
        assert!(paths.contains(p), "{p:?} not in {paths:?}");
    }
    for p in ["docs", "docs/deep/er", "empty", "docs/link", "pipe", "up"] {
        assert!(paths.contains(&PathBuf::from(p)), "{p}");
    }
    let items = walk::collect(&v, &c);
    assert!(items.iter().all(|i| !matches!(i, Item::Bad(_))));
    let internal = items
        .iter()
        .filter(|i| matches!(i, Item::Internal(_)))
        .count();
    // config + 4 dirids + 1 sidecar
    assert_eq!(internal, 6);
    // Parents come before children.
    let order: Vec<PathBuf> = items
        .iter()
        .filter_map(|i| match i {
            Item::Entry(e) => Some(e.plain.clone()),
            _ => None,
        })
        .collect();
    let pos = |p: &str| order.iter().position(|x| x == Path::new(p)).unwrap();
    assert!(pos("docs") < pos("docs/deep") && pos("docs/deep") < pos("docs/deep/er/x"));
}

#[test]
fn names_translate_both_ways_with_symlinks_and_long_names() {
    let (_t, c, _) = build();
    let v = unlock(&c);
    for p in ["hello.txt", "docs/big.bin", "docs/deep/er/x", "empty"] {
        let b = translate::lookup(&v, &c, Path::new(p), false).unwrap();
        assert!(b.exists());
        assert_eq!(translate::decrypt_path(&v, &c, &b).unwrap(), Path::new(p));
        // relative to the cipher directory works too
        let rel = b.strip_prefix(&c).unwrap();
        assert_eq!(translate::decrypt_path(&v, &c, rel).unwrap(), Path::new(p));
    }
    let long = PathBuf::from("docs").join(long_name());
    let b = translate::lookup(&v, &c, &long, false).unwrap();
    let name = b.file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("cloakfs.long."), "{name}");
    assert_eq!(translate::decrypt_path(&v, &c, &b).unwrap(), long);
    let sidecar = b.with_file_name(format!("{name}.name"));
    assert_eq!(translate::decrypt_path(&v, &c, &sidecar).unwrap(), long);
    // symlinks inside the volume are followed, `..` resolved
    assert_eq!(read_plain(&v, &c, Path::new("docs/link")), vec![1u8; 4096]);
    assert_eq!(read_plain(&v, &c, Path::new("up")), b"hello world\n");
    assert_eq!(
        read_plain(&v, &c, Path::new("docs/deep/../../hello.txt")),
        b"hello world\n"
    );
    assert!(translate::lookup(&v, &c, Path::new("../x"), true).is_err());
    assert!(translate::lookup(&v, &c, Path::new("nope/x"), true).is_err());
    // not followed when asked not to
    let l = translate::lookup(&v, &c, Path::new("docs/link"), false).unwrap();
    assert!(std::fs::symlink_metadata(l)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        translate::find_volume_root(&b).unwrap(),
        std::fs::canonicalize(&c).unwrap()
    );
    assert!(translate::decrypt_path(&v, &c, Path::new("/etc/passwd")).is_err());
}

#[test]
fn fsck_finds_and_repairs() {
    let (_t, c, _) = build();
    let v = unlock(&c);
    let r = fsck::check(&v, &c, Options::default(), &NoProgress).unwrap();
    assert!(r.clean, "{:?}", r.problems);
    assert_eq!(r.counts.files, 6);
    assert_eq!(r.counts.symlinks, 2);
    // Damage: a flipped block, an orphan sidecar, a stray temp file, an empty dir without ID.
    let big = translate::lookup(&v, &c, Path::new("docs/big.bin"), false).unwrap();
    let mut bytes = std::fs::read(&big).unwrap();
    bytes[18 + 300 * 4124 + 50] ^= 1;
    std::fs::write(&big, bytes).unwrap();
    let docs = translate::lookup(&v, &c, Path::new("docs"), false).unwrap();
    std::fs::write(docs.join("cloakfs.long.AAAA.name"), "x").unwrap();
    std::fs::write(c.join("cloakfs.conf.tmp.4000000"), "{}").unwrap();
    let empty = translate::lookup(&v, &c, Path::new("empty"), false).unwrap();
    std::fs::remove_file(empty.join("cloakfs.dirid")).unwrap();
    let r = fsck::check(&v, &c, Options::default(), &NoProgress).unwrap();
    let mut kinds: Vec<String> = r.problems.iter().map(|p| format!("{:?}", p.kind)).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        vec!["Block", "DiridMissing", "OrphanSidecar", "StrayTemp"],
        "{:?}",
        r.problems
    );
    let block = r
        .problems
        .iter()
        .find(|p| p.kind == ProblemKind::Block)
        .unwrap();
    assert_eq!(block.plain.as_deref(), Some(Path::new("docs/big.bin")));
    assert!(block.detail.contains("block 300"), "{}", block.detail);
    assert!(!block.repairable);
    let r = fsck::check(&v, &c, Options { repair: true }, &NoProgress).unwrap();
    assert_eq!(r.counts.repaired, 3);
    let r = fsck::check(&v, &c, Options::default(), &NoProgress).unwrap();
    assert_eq!(r.problems.len(), 1);
    assert_eq!(r.problems[0].kind, ProblemKind::Block);
}

/// What a power cut can leave of unsynced data: the length, with zeros for bytes. fsck calls
/// them unwritten, and --repair makes them plaintext zeros (all the disk holds of them); a
/// block of non-zero garbage stays a tampered block.
#[test]
fn fsck_repairs_bytes_that_never_reached_the_disk_as_zeros() {
    let (_t, c, _) = build();
    let v = unlock(&c);
    let hello = translate::lookup(&v, &c, Path::new("hello.txt"), false).unwrap();
    let len = std::fs::metadata(&hello).unwrap().len();
    std::fs::write(&hello, vec![0u8; len as usize]).unwrap();
    let big = translate::lookup(&v, &c, Path::new("docs/big.bin"), false).unwrap();
    let mut bytes = std::fs::read(&big).unwrap();
    let last = bytes.len() - 100; // inside the partial last block: no hole
    let first_block = 18 + 4124 * 5;
    bytes[first_block..first_block + 4124].fill(0); // a hole: reads as zeros already
    let tail = 18 + 4124 * (3_000_000 / 4096);
    bytes[tail..].fill(0);
    bytes[18 + 4124 * 9 + 7] ^= 1;
    assert!(last > tail);
    std::fs::write(&big, &bytes).unwrap();
    let r = fsck::check(&v, &c, Options::default(), &NoProgress).unwrap();
    let mut kinds: Vec<String> = r.problems.iter().map(|p| format!("{:?}", p.kind)).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        vec!["Block", "Unwritten", "Unwritten"],
        "{:?}",
        r.problems
    );
    let r = fsck::check(&v, &c, Options { repair: true }, &NoProgress).unwrap();
    assert_eq!(r.counts.repaired, 2, "{:?}", r.problems);
    let r = fsck::check(&v, &c, Options::default(), &NoProgress).unwrap();
    assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
    assert_eq!(r.problems[0].kind, ProblemKind::Block);
    // The zeroed file has its plaintext length, in zeros; the big file keeps its other bytes.
    assert_eq!(read_plain(&v, &c, Path::new("hello.txt")), vec![0u8; 12]);
}

#[test]
fn export_copies_the_tree() {
    let (t, c, files) = build();
    let v = unlock(&c);
    let dest = t.path().join("out");
    let r = cloakfs_core::tools::export::export(&v, &c, &dest, &NoProgress).unwrap();
    assert!(r.skipped.is_empty(), "{:?}", r.skipped);
    for (p, d) in &files {
        assert_eq!(&std::fs::read(dest.join(p)).unwrap(), d, "{p:?}");
    }
    assert_eq!(
        std::fs::read_link(dest.join("docs/link")).unwrap(),
        Path::new("deep/er/x")
    );
    assert!(std::fs::symlink_metadata(dest.join("pipe"))
        .unwrap()
        .file_type()
        .is_fifo());
    let a = std::fs::metadata(dest.join("hello.txt")).unwrap();
    let b = std::fs::metadata(dest.join("docs/hello-again")).unwrap();
    assert_eq!(a.ino(), b.ino(), "hard link kept");
    assert!(std::fs::metadata(dest.join("empty")).unwrap().is_dir());
    // The destination must be new or empty.
    assert!(cloakfs_core::tools::export::export(&v, &c, &dest, &NoProgress).is_err());
}

/// Every backing name and file (by content hash) of a cipher directory.
fn snapshot(c: &Path) -> (Vec<PathBuf>, BTreeMap<PathBuf, Vec<u8>>) {
    let mut names = Vec::new();
    let mut contents = BTreeMap::new();
    let mut stack = vec![c.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            names.push(p.strip_prefix(c).unwrap().to_path_buf());
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() {
                contents.insert(
                    p.strip_prefix(c).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
    names.sort();
    (names, contents)
}

#[test]
fn rekey_moves_everything_to_a_new_key_and_rollback_restores() {
    let (_t, c, files) = build();
    let old = unlock(&c);
    let (names_before, contents_before) = snapshot(&c);
    let s = rekey::start(&old, &c, rekey::Options::default(), &NoProgress).unwrap();
    assert_eq!(s.outcome, rekey::Outcome::Completed);
    assert!(!rekey::journal_path(&c).exists());
    let new = unlock(&c);
    assert_ne!(old.master_key().expose(), new.master_key().expose());
    for (p, d) in &files {
        assert_eq!(&read_plain(&new, &c, p), d, "{p:?}");
    }
    // Nothing decrypts with the old key any more: every name in the root is unreadable.
    assert!(walk::collect(&old, &c)
        .iter()
        .any(|i| matches!(i, Item::Bad(_))));
    assert!(walk::plain_paths(&old, &c).unwrap().is_empty());
    let (names_after, contents_after) = snapshot(&c);
    let common: Vec<_> = names_after
        .iter()
        .filter(|n| names_before.contains(n))
        .filter(|n| !n.ends_with("cloakfs.dirid") && *n != Path::new("cloakfs.conf"))
        .collect();
    assert!(common.is_empty(), "names kept: {common:?}");
    assert_eq!(contents_after.len(), contents_before.len());
    let r = fsck::check(&new, &c, Options::default(), &NoProgress).unwrap();
    assert!(r.clean, "{:?}", r.problems);
    let hello = translate::lookup(&new, &c, Path::new("hello.txt"), false).unwrap();
    let again = translate::lookup(&new, &c, Path::new("docs/hello-again"), false).unwrap();
    assert_eq!(
        std::fs::metadata(hello).unwrap().ino(),
        std::fs::metadata(again).unwrap().ino(),
        "hard link kept"
    );
    // A journal blocks everything but resume/rollback.
    std::fs::write(rekey::journal_path(&c), "{}").unwrap();
    assert!(matches!(
        rekey::check_not_rekeying(&c),
        Err(cloakfs_core::Error::Busy(_))
    ));
    assert!(fsck::check(&new, &c, Options::default(), &NoProgress).is_err());
    assert!(
        rekey::resume(&new, &c, None, &NoProgress).is_err(),
        "damaged journal"
    );
    std::fs::remove_file(rekey::journal_path(&c)).unwrap();
    assert_eq!(mounts::mounted_at(&c).unwrap(), None);
}

#[test]
fn rekey_refuses_other_slots_unless_dropped() {
    let (_t, c, _) = build();
    let v = unlock(&c);
    let mut cfg = v.config().clone();
    cfg.add_passphrase_slot(
        v.master_key(),
        &Passphrase::new(b"second".to_vec()),
        Argon2Params::LEAST,
        "second",
        cloakfs_core::format::config::SlotRandomness::fresh(),
    )
    .unwrap();
    cfg.seal(v.master_key());
    cfg.save(&c).unwrap();
    let v = unlock(&c);
    let e = rekey::start(&v, &c, rekey::Options::default(), &NoProgress).unwrap_err();
    assert!(e.to_string().contains("--drop-other-slots"), "{e}");
    assert!(!rekey::journal_path(&c).exists());
    let s = rekey::start(
        &v,
        &c,
        rekey::Options {
            drop_other_slots: true,
            known: None,
        },
        &NoProgress,
    )
    .unwrap();
    assert_eq!(s.dropped_slots, vec![2]);
    assert!(Volume::unlock(&c, &Passphrase::new(b"second".to_vec())).is_err());
    let v2 = unlock(&c);
    assert_eq!(v2.config().slots().len(), 1);
    assert_eq!(
        read_plain(&v2, &c, Path::new("hello.txt")),
        b"hello world\n"
    );
}

/// FORMAT.md 9.1: each name has one stored form. A long name moved into the short form and a
/// short name moved into the long form are damaged entries to every reader, never names.
#[test]
fn names_in_the_other_stored_form_are_refused() {
    use cloakfs_core::format::names;
    let tmp = tempfile::tempdir().unwrap();
    let c = tmp.path().join("cipher");
    // With long_name_max 100, a 70-byte name is stored long (115 characters), a 40-byte one
    // short (75 characters).
    let mut params = VolumeParams::new();
    params.long_name_max = 100;
    let v = Volume::create(&c, params, &pass(), Argon2Params::LEAST).unwrap();
    let (long, short) = ("l".repeat(70), "s".repeat(40));
    let w = Writer::new(&v, &c);
    for p in [long.as_str(), short.as_str(), "kept"] {
        w.write_file(Path::new(p), p.as_bytes()).unwrap();
    }
    let lb = translate::lookup(&v, &c, Path::new(&long), false).unwrap();
    let sb = translate::lookup(&v, &c, Path::new(&short), false).unwrap();
    let lb_name = lb.file_name().unwrap().to_str().unwrap().to_string();
    let side = c.join(names::sidecar_name(&lb_name));
    let full = std::fs::read_to_string(&side).unwrap();
    assert!(full.len() > 100 && full.len() <= 255, "{}", full.len());
    std::fs::rename(&lb, c.join(&full)).unwrap();
    std::fs::remove_file(&side).unwrap();
    let e = sb.file_name().unwrap().to_str().unwrap().to_string();
    let as_long = names::long_backing_name(&e);
    std::fs::write(c.join(names::sidecar_name(&as_long)), &e).unwrap();
    std::fs::rename(&sb, c.join(&as_long)).unwrap();

    let v = unlock(&c);
    let r = fsck::check(&v, &c, Options::default(), &NoProgress).unwrap();
    let mut found: Vec<(ProblemKind, String)> = r
        .problems
        .iter()
        .map(|p| {
            let name = p.backing.file_name().unwrap().to_str().unwrap().to_string();
            (p.kind, name)
        })
        .collect();
    found.sort_by(|a, b| a.1.cmp(&b.1));
    let mut want = vec![
        (ProblemKind::Name, full.clone()),
        (ProblemKind::LongName, as_long.clone()),
    ];
    want.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(found, want, "{:?}", r.problems);
    for p in &r.problems {
        assert!(!p.repairable && p.plain.is_none(), "{p:?}");
    }
    // Neither is found under its name (a lookup computes the one stored form) nor decrypts
    // from its backing path; the rest reads.
    for p in [&long, &short] {
        let b = translate::lookup(&v, &c, Path::new(p), false).unwrap();
        assert!(std::fs::symlink_metadata(b).is_err());
    }
    for b in [&full, &as_long] {
        let e = translate::decrypt_path(&v, &c, &c.join(b)).unwrap_err();
        assert!(matches!(e, cloakfs_core::Error::Tampered(_)), "{e}");
    }
    assert_eq!(read_plain(&v, &c, Path::new("kept")), b"kept");
}

/// A planted rekey journal far larger than any real one is refused before it is read into
/// memory (it was read whole).
#[test]
fn oversized_rekey_journal_is_refused_unread() {
    let tmp = tempfile::tempdir().unwrap();
    let c = tmp.path().join("cipher");
    let v = Volume::create(&c, VolumeParams::new(), &pass(), Argon2Params::LEAST).unwrap();
    std::fs::File::create(rekey::journal_path(&c))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    for result in [
        rekey::resume(&v, &c, None, &NoProgress),
        rekey::rollback(&v, &c, None, &NoProgress),
    ] {
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains("rekey journal") && err.contains("too large"),
            "{err}"
        );
    }
}
