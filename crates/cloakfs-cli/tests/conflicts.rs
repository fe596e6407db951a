//! Sync clients' conflict copies in a volume's cipher directory (issue 41): listed through
//! the mount under a readable name that says what they are, readable, writable, renamable
//! and removable there; `name -d`, `export` and `fsck` name them the same way, and
//! `fsck --repair` keeps them.
//!
//! Only Syncthing runs here; the other clients' copies are made by renaming backing entries
//! exactly as each client names its copies (see `cloakfs_core::sync_folder::SyncClient`).

mod common;

use cloakfs_core::crypto::secret::Passphrase;
use cloakfs_core::tools::writer::Writer;
use cloakfs_core::Volume;
use common::*;
use std::path::{Path, PathBuf};

/// A plaintext name, its conflict copy's shown name, and the client's renaming.
type Client = (&'static str, &'static str, fn(&str) -> String);

const PASS: &[u8] = b"correct horse battery";
const ST: &str = "sync-conflict-20261128-101010-4CTITOD";

fn long_stem() -> String {
    "a-long-report-name-".repeat(10)
}

fn volume(f: &Fixture) -> Volume {
    Volume::unlock(&f.cipher, &Passphrase::new(PASS.to_vec())).unwrap()
}

/// Writes `plain` with `copy_data`, renames its backing entry (and, with `sidecar`, its
/// long name's sidecar) as `rename` says a client names its conflict copy, then writes
/// `plain` again with `data`: the state a client leaves after keeping one edit of two.
fn make_conflict(
    f: &Fixture,
    plain: &str,
    copy_data: &[u8],
    data: Option<&[u8]>,
    rename: impl Fn(&str) -> String,
    sidecar: bool,
) -> PathBuf {
    let v = volume(f);
    let w = Writer::new(&v, &f.cipher);
    w.write_file(Path::new(plain), copy_data).unwrap();
    let b = w.backing(Path::new(plain)).unwrap();
    let name = b.file_name().unwrap().to_str().unwrap().to_string();
    let copy = b.with_file_name(rename(&name));
    std::fs::rename(&b, &copy).unwrap();
    if sidecar {
        let side = format!("{name}.name");
        std::fs::rename(b.with_file_name(&side), b.with_file_name(rename(&side))).unwrap();
    }
    if let Some(d) = data {
        w.write_file(Path::new(plain), d).unwrap();
    }
    copy
}

/// Syncthing's naming: the marker before the last `.` part.
fn syncthing(name: &str) -> String {
    match name.rfind('.') {
        Some(i) => format!("{}.{ST}{}", &name[..i], &name[i..]),
        None => format!("{name}.{ST}"),
    }
}

fn ls(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn run(f: &Fixture, args: &[&str]) -> std::process::Output {
    let (cmd, rest) = args.split_first().unwrap();
    f.run(&[&[*cmd, "--passfile", s(&f.pass)], rest].concat())
}

#[test]
fn conflict_copies_of_every_client_are_listed_read_renamed_and_removed_through_the_mount() {
    let f = Fixture::new();
    let v = volume(&f);
    let w = Writer::new(&v, &f.cipher);
    w.mkdir(Path::new("docs")).unwrap();
    drop(w);
    // Syncthing: a short name, and a long name without and with a copy of its sidecar (the
    // latter with no original left at all).
    make_conflict(
        &f,
        "report.txt",
        b"edit on A",
        Some(b"edit on B"),
        syncthing,
        false,
    );
    let long1 = format!("{}.txt", long_stem());
    make_conflict(&f, &long1, b"long A", Some(b"long B"), syncthing, false);
    let long2 = format!("{}2.md", long_stem());
    make_conflict(&f, &long2, b"only copy", None, syncthing, true);
    // The other clients, one file each in docs/.
    let clients: [Client; 6] = [
        (
            "dropbox.txt",
            "dropbox (conflict 2026-11-28 Ann).txt",
            |n| format!("{n} (Ann's conflicted copy 2026-11-28)"),
        ),
        (
            "nextcloud.txt",
            "nextcloud (conflict 2026-11-28).txt",
            |n| format!("{n} (conflicted copy 2026-11-28 101010)"),
        ),
        ("owncloud.txt", "owncloud (conflict 2026-11-28).txt", |n| {
            format!("{n}_conflict-20261128-101010")
        }),
        ("onedrive.txt", "onedrive (conflict LAPTOP-7).txt", |n| {
            format!("{n}-LAPTOP-7")
        }),
        ("resilio.txt", "resilio (conflict Resilio).txt", |n| {
            format!("{n}.Conflict")
        }),
        ("gdrive.txt", "gdrive (conflict 1).txt", |n| {
            format!("{n} (1)")
        }),
    ];
    for (plain, _, rename) in &clients {
        let p = format!("docs/{plain}");
        make_conflict(&f, &p, b"their edit", Some(b"mine"), rename, false);
    }
    // A real entry that already has a copy's shown name: the copy's name gets a tag.
    let v = volume(&f);
    let w = Writer::new(&v, &f.cipher);
    w.write_file(Path::new("docs/gdrive (conflict 1).txt"), b"a real file")
        .unwrap();
    // A symlink, copied the Dropbox way.
    w.symlink(Path::new("link"), b"report.txt").unwrap();
    let lb = w.backing(Path::new("link")).unwrap();
    let lname = lb.file_name().unwrap().to_str().unwrap().to_string();
    std::fs::rename(
        &lb,
        lb.with_file_name(format!("{lname} (Ann's conflicted copy 2026-11-28)")),
    )
    .unwrap();
    w.symlink(Path::new("link"), b"docs").unwrap();
    drop(w);

    let m = f.mounted(&[]);
    let root = ls(&f.mnt);
    let c1 = "report (conflict 2026-11-28 4CTITOD).txt".to_string();
    let cl1 = format!("{} (conflict 2026-11-28 4CTITOD).txt", long_stem());
    let cl2 = format!("{}2 (conflict 2026-11-28 4CTITOD).md", long_stem());
    let cln = "link (conflict 2026-11-28 Ann)".to_string();
    let mut want = vec![
        c1.clone(),
        cl1.clone(),
        cl2.clone(),
        long1.clone(),
        "docs".into(),
        "link".into(),
        cln.clone(),
        "report.txt".into(),
    ];
    want.sort();
    assert_eq!(root, want);
    // Edits made = versions readable.
    let read = |p: &str| std::fs::read(f.mnt.join(p)).unwrap();
    assert_eq!(read("report.txt"), b"edit on B");
    assert_eq!(read(&c1), b"edit on A");
    assert_eq!(read(&long1), b"long B");
    assert_eq!(read(&cl1), b"long A");
    assert_eq!(read(&cl2), b"only copy");
    assert_eq!(
        std::fs::read_link(f.mnt.join(&cln)).unwrap(),
        Path::new("report.txt")
    );
    let docs = ls(&f.mnt.join("docs"));
    for (plain, shown, _) in &clients {
        assert!(docs.contains(&plain.to_string()), "{docs:?}");
        if *plain == "gdrive.txt" {
            continue;
        }
        assert!(docs.contains(&shown.to_string()), "{shown} in {docs:?}");
        assert_eq!(read(&format!("docs/{shown}")), b"their edit");
    }
    // `ls` never shows one name twice: the real file keeps its name, the copy is tagged.
    assert_eq!(read("docs/gdrive (conflict 1).txt"), b"a real file");
    let tagged: Vec<&String> = docs
        .iter()
        .filter(|n| n.starts_with("gdrive (conflict 1 #"))
        .collect();
    assert_eq!(tagged.len(), 1, "{docs:?}");
    assert_eq!(read(&format!("docs/{}", tagged[0])), b"their edit");
    let mut dedup = docs.clone();
    dedup.dedup();
    assert_eq!(dedup, docs);
    // Writable where it is.
    std::fs::write(
        f.mnt.join("docs/dropbox (conflict 2026-11-28 Ann).txt"),
        b"merged",
    )
    .unwrap();
    assert_eq!(
        read("docs/dropbox (conflict 2026-11-28 Ann).txt"),
        b"merged"
    );
    // Resolving: the copy renamed over the original replaces it; another removed.
    std::fs::rename(f.mnt.join(&c1), f.mnt.join("report.txt")).unwrap();
    assert_eq!(read("report.txt"), b"edit on A");
    std::fs::rename(f.mnt.join(&cl1), f.mnt.join(&long1)).unwrap();
    assert_eq!(read(&long1), b"long A");
    std::fs::remove_file(f.mnt.join("docs/nextcloud (conflict 2026-11-28).txt")).unwrap();
    let root = ls(&f.mnt);
    assert!(!root.contains(&c1) && !root.contains(&cl1), "{root:?}");
    assert!(!ls(&f.mnt.join("docs")).contains(&"nextcloud (conflict 2026-11-28).txt".into()));
    m.unmount();
}

#[test]
fn name_fsck_and_export_name_conflict_copies_as_the_mount_does_and_repair_keeps_them() {
    let f = Fixture::new();
    let copy = make_conflict(
        &f,
        "report.txt",
        b"edit on A",
        Some(b"edit on B"),
        syncthing,
        false,
    );
    let long = format!("{}.txt", long_stem());
    let lcopy = make_conflict(&f, &long, b"only copy", None, syncthing, true);
    let v = volume(&f);
    let w = Writer::new(&v, &f.cipher);
    // A symlink with a long target whose copy is all that is left of its version.
    let target = "t/".repeat(1600);
    w.symlink(Path::new("ln"), target.as_bytes()).unwrap();
    let lb = w.backing(Path::new("ln")).unwrap();
    let lname = lb.file_name().unwrap().to_str().unwrap().to_string();
    std::fs::rename(&lb, lb.with_file_name(syncthing(&lname))).unwrap();
    drop(w);

    let out = run(&f, &["name", "-d", s(&f.cipher), s(&copy)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "/report (conflict 2026-11-28 4CTITOD).txt\n"
    );
    let out = run(&f, &["name", "-d", s(&f.cipher), s(&lcopy)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("/{} (conflict 2026-11-28 4CTITOD).txt\n", long_stem())
    );

    for repair in [false, true] {
        let mut args = vec!["fsck"];
        if repair {
            args.push("--repair");
        }
        args.push(s(&f.cipher));
        let out = run(&f, &args);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert!(
            text.contains(
                "conflict copy of /report.txt (Syncthing, 2026-11-28 10:10:10, device 4CTITOD)"
            ),
            "{text}"
        );
        assert!(
            text.contains(&format!("conflict copy of /{long} (Syncthing")),
            "{text}"
        );
        assert!(text.contains("conflict copy of /ln (Syncthing"), "{text}");
        assert!(!text.contains("does not belong here"), "{text}");
        assert!(!text.contains("no symlink points to"), "{text}");
        assert!(copy.exists() && lcopy.exists());
    }
    // The long target is still there: the copy still reads.
    let dest = f.tmp.path().join("export");
    let out = run(&f, &["export", s(&f.cipher), s(&dest)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(dest.join("report (conflict 2026-11-28 4CTITOD).txt")).unwrap(),
        b"edit on A"
    );
    assert_eq!(
        std::fs::read(dest.join("report.txt")).unwrap(),
        b"edit on B"
    );
    assert_eq!(
        std::fs::read(dest.join(format!("{} (conflict 2026-11-28 4CTITOD).txt", long_stem())))
            .unwrap(),
        b"only copy"
    );
    assert_eq!(
        std::fs::read_link(dest.join("ln (conflict 2026-11-28 4CTITOD)")).unwrap(),
        Path::new(&target)
    );
}

#[test]
fn a_long_target_no_symlink_points_to_is_restored_not_deleted() {
    let f = Fixture::new();
    let v = volume(&f);
    let w = Writer::new(&v, &f.cipher);
    let target = "x/".repeat(1600);
    w.symlink(Path::new("ln"), target.as_bytes()).unwrap();
    // The sync client replaced this version of the symlink and kept no copy of it.
    std::fs::remove_file(w.backing(Path::new("ln")).unwrap()).unwrap();
    drop(w);
    let out = run(&f, &["fsck", "--repair", s(&f.cipher)]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(
        text.contains("repair restores it as symlink /lost symlink "),
        "{text}"
    );
    let dest = f.tmp.path().join("export");
    let out = run(&f, &["export", s(&f.cipher), s(&dest)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let names = ls(&dest);
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].starts_with("lost symlink "), "{names:?}");
    assert_eq!(
        std::fs::read_link(dest.join(&names[0])).unwrap(),
        Path::new(&target)
    );
}

/// With real Syncthing: both devices edit one file (a short and a long name) while apart;
/// after the sync both mounts list Syncthing's conflict copy under its readable name, and
/// every edit made is readable on both devices.
#[test]
fn syncthing_conflict_copies_are_listed_and_read_on_both_devices() {
    use common::syncthing::{wait_until, Pair, SyncedVolume};
    let pair = Pair::start();
    let vol = SyncedVolume::init(&pair);
    let opts = ["--cache-timeout", "1"];
    let (ma, mb) = (vol.a.mounted(&opts), vol.b.mounted(&opts));
    let long = format!("{}.txt", long_stem());
    let names = ["report.txt".to_string(), long.clone()];
    for n in &names {
        std::fs::write(vol.a.mnt.join(n), b"first").unwrap();
    }
    pair.sync();
    pair.pause();
    for (f, side) in [(&vol.a, "A"), (&vol.b, "B")] {
        for n in &names {
            std::fs::write(f.mnt.join(n), format!("edit on {side} of {n}")).unwrap();
        }
    }
    // Each side indexes its own edit while apart (the watcher is off), so that Syncthing sees
    // two concurrent versions when they meet.
    let scan = format!("/rest/db/scan?folder={}", common::syncthing::FOLDER);
    pair.a.request("POST", &scan);
    pair.b.request("POST", &scan);
    pair.resume();
    pair.sync();
    for f in [&vol.a, &vol.b] {
        for n in &names {
            let (stem, _) = n.rsplit_once('.').unwrap();
            let want: std::collections::BTreeSet<String> = ["A", "B"]
                .iter()
                .map(|side| format!("edit on {side} of {n}"))
                .collect();
            // The mount's entries live a second (`--cache-timeout 1`): poll until it shows
            // what the folder holds.
            wait_until(&format!("{n}: both edits readable"), || {
                let listed = ls(&f.mnt);
                let copies: Vec<&String> = listed
                    .iter()
                    .filter(|l| l.starts_with(&format!("{stem} (conflict ")))
                    .collect();
                if copies.len() != 1 {
                    return false;
                }
                let got: std::collections::BTreeSet<String> = [n, copies[0]]
                    .iter()
                    .filter_map(|p| std::fs::read_to_string(f.mnt.join(p)).ok())
                    .collect();
                got == want
            });
        }
    }
    ma.unmount();
    mb.unmount();
    pair.stop();
}

/// Syncthing's name for the losing device's copy of a directory's ID file.
const ID_COPY: &str = "cloakfs.sync-conflict-20261128-151500-K64EJMH.dirid";

/// `docs` with two IDs, as Syncthing leaves a directory two devices made with random IDs:
/// `a.txt` named under the ID now in the copy [`ID_COPY`], then `b.txt` (and whatever
/// `more` names) under the one in `cloakfs.dirid`. Returns `a.txt`'s backing path.
fn two_ids(f: &Fixture, more: &[(&str, &[u8])]) -> PathBuf {
    two_ids_with(f, |_| (), more).0
}

/// [`two_ids`], where `made_on_a` also makes entries under the copy's ID (whose result is
/// returned beside `a.txt`'s backing path).
fn two_ids_with<T>(
    f: &Fixture,
    made_on_a: impl FnOnce(&Writer) -> T,
    more: &[(&str, &[u8])],
) -> (PathBuf, T) {
    let v = volume(f);
    let w = Writer::new(&v, &f.cipher);
    let docs = w.mkdir(Path::new("docs")).unwrap();
    let a = w.write_file(Path::new("docs/a.txt"), b"made on A").unwrap();
    let made = made_on_a(&w);
    std::fs::rename(docs.join("cloakfs.dirid"), docs.join(ID_COPY)).unwrap();
    std::fs::write(docs.join("cloakfs.dirid"), [0x5a; 16]).unwrap();
    w.write_file(Path::new("docs/b.txt"), b"made on B").unwrap();
    for (n, data) in more {
        w.write_file(&Path::new("docs").join(n), data).unwrap();
    }
    (a, made)
}

/// `name -d` decrypts a name made under a directory's other ID file and says so; `rekey`
/// refuses such a volume in one line pointing at `fsck --repair` (changing nothing), and
/// converts it once repaired.
#[test]
fn name_and_rekey_on_a_directory_with_two_ids() {
    let f = Fixture::new();
    let a = two_ids(&f, &[]);
    let out = run(&f, &["name", "-d", s(&f.cipher), s(&a)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "/docs/a.txt\n");
    assert!(
        err.contains(ID_COPY) && err.contains("fsck --repair"),
        "{err}"
    );

    let before = tree(&f.cipher);
    let out = run(&f, &["rekey", s(&f.cipher)]);
    assert_fails(&out, 2, "fsck --repair");
    assert!(stderr(&out).contains("/docs"), "{}", stderr(&out));
    assert_eq!(
        tree(&f.cipher),
        before,
        "a refused rekey changed the cipher directory"
    );

    run(&f, &["fsck", "--repair", s(&f.cipher)]);
    let out = run(&f, &["fsck", s(&f.cipher)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = run(&f, &["rekey", s(&f.cipher)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let dest = f.tmp.path().join("export");
    let out = run(&f, &["export", s(&f.cipher), s(&dest)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(dest.join("docs/a.txt")).unwrap(),
        b"made on A"
    );
    assert_eq!(
        std::fs::read(dest.join("docs/b.txt")).unwrap(),
        b"made on B"
    );
}

/// `name` (plaintext path to backing path) finds an entry where the mount does: a name made
/// under the directory's ID-file copy is that copy's backing entry (and `name` says which
/// copy), a name taken under both IDs is the one under `cloakfs.dirid`, and the other is
/// found by the conflict name it is listed under; a path through a directory named under
/// the copy resolves too.
#[test]
fn name_finds_entries_named_under_an_id_files_copy() {
    let f = Fixture::new();
    // Named under the copy's ID only: a file, and a directory with a file in it.
    let (a, (only_a, inner)) = two_ids_with(
        &f,
        |w| {
            let only_a = w.write_file(Path::new("docs/only-a.txt"), b"A").unwrap();
            w.mkdir(Path::new("docs/sub")).unwrap();
            (only_a, w.write_file(Path::new("docs/sub/x"), b"x").unwrap())
        },
        &[("a.txt", b"made on B too")],
    );
    let v = volume(&f);
    let b = Writer::new(&v, &f.cipher)
        .backing(Path::new("docs/a.txt"))
        .unwrap();
    let name = |plain: &str| {
        let out = run(&f, &["name", s(&f.cipher), plain]);
        assert!(out.status.success(), "{plain}: {}", stderr(&out));
        let err = stderr(&out);
        (
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim_end()),
            err,
        )
    };
    let (got, err) = name("docs/only-a.txt");
    assert_eq!(got, only_a);
    assert!(err.contains(ID_COPY), "{err}");
    assert_eq!(name("docs/sub/x").0, inner);
    assert_eq!(name("docs/a.txt").0, b);
    let (got, err) = name("docs/a (conflict 2026-11-28 K64EJMH).txt");
    assert_eq!(got, a);
    assert!(err.contains(ID_COPY), "{err}");
    // The mount reads the same entries under those names.
    let m = f.mounted(&[]);
    assert_eq!(std::fs::read(f.mnt.join("docs/only-a.txt")).unwrap(), b"A");
    assert_eq!(std::fs::read(f.mnt.join("docs/sub/x")).unwrap(), b"x");
    m.unmount();
}

/// The mount logs a directory with several IDs, and each conflict copy, the first time it
/// meets them: one line each in its log after lookups and listings, whichever comes first.
#[test]
fn a_directory_with_several_ids_and_a_conflict_copy_are_logged_once() {
    let f = Fixture::new();
    two_ids(&f, &[]);
    make_conflict(
        &f,
        "docs/b.txt",
        b"edit on A",
        Some(b"made on B"),
        syncthing,
        false,
    );
    let log = f.tmp.path().join("mount.log");
    // Nothing cached by the kernel: every lookup and listing reaches the mount.
    let m = f.mounted(&["--cache-timeout", "0", "--log-file", s(&log)]);
    let docs = f.mnt.join("docs");
    let shown = "b (conflict 2026-11-28 4CTITOD).txt";
    for _ in 0..3 {
        assert_eq!(std::fs::read(docs.join("a.txt")).unwrap(), b"made on A");
        assert_eq!(ls(&docs), ["a.txt", shown, "b.txt"]);
        assert_eq!(std::fs::read(docs.join(shown)).unwrap(), b"edit on A");
    }
    m.unmount();
    let log = std::fs::read_to_string(&log).unwrap();
    let lines = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    assert_eq!(lines("directory has several IDs"), 1, "{log}");
    assert_eq!(lines(ID_COPY), 1, "{log}");
    assert_eq!(lines("a conflict copy made by Syncthing"), 1, "{log}");
}

/// `fsck --repair` merging a directory with several IDs keeps its conflict copies where they
/// were: listed under the same names, with the same contents, before and after.
#[test]
fn merging_a_directorys_ids_keeps_its_conflict_copies() {
    let f = Fixture::new();
    two_ids(&f, &[]);
    let long = format!("docs/{}.txt", long_stem());
    for (plain, sidecar) in [("docs/b.txt", false), (long.as_str(), true)] {
        make_conflict(&f, plain, b"edit on A", Some(b"kept"), syncthing, sidecar);
    }
    make_conflict(
        &f,
        "docs/c.txt",
        b"edit on A",
        Some(b"kept"),
        |n| format!("{n} (Ann's conflicted copy 2026-11-28)"),
        false,
    );
    let exported = |dest: &str| {
        let dest = f.tmp.path().join(dest);
        let out = run(&f, &["export", s(&f.cipher), s(&dest)]);
        assert!(out.status.success(), "{}", stderr(&out));
        ls(&dest.join("docs"))
            .into_iter()
            .map(|n| {
                let data = std::fs::read(dest.join("docs").join(&n)).unwrap();
                (n, data)
            })
            .collect::<Vec<_>>()
    };
    let before = exported("before");
    assert_eq!(before.len(), 7, "{before:?}");
    run(&f, &["fsck", "--repair", s(&f.cipher)]);
    let out = run(&f, &["fsck", s(&f.cipher)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(exported("after"), before);
    let left: Vec<String> = ls(&f.cipher.join(
        Writer::new(&volume(&f), &f.cipher)
            .backing(Path::new("docs"))
            .unwrap(),
    ))
    .into_iter()
    .filter(|n| n.contains("sync-conflict") || n.contains("dirid"))
    .collect();
    assert_eq!(
        left,
        ["cloakfs.dirid"],
        "copies of sidecars or ID files left"
    );
}

/// A sync client's conflict copy of an entry named under the ID in the ID file's copy (a file
/// edited on two devices in a directory with two IDs): the mount lists and reads it, and
/// looks it up by name, `export` and the mount list the same names, and `fsck --repair` keeps
/// it under that name.
#[test]
fn conflict_copies_of_entries_under_an_id_files_copy_are_shown_and_kept() {
    let f = Fixture::new();
    let dropbox = |n: &str| format!("{n} (Ann's conflicted copy 2026-11-28)");
    two_ids_with(
        &f,
        |_| {
            make_conflict(
                &f,
                "docs/e.txt",
                b"edit on A",
                Some(b"kept"),
                syncthing,
                false,
            );
            make_conflict(&f, "docs/d.md", b"edit on A", Some(b"kept"), dropbox, false);
        },
        &[],
    );
    let want = [
        ("a.txt", &b"made on A"[..]),
        ("b.txt", b"made on B"),
        ("d (conflict 2026-11-28 Ann).md", b"edit on A"),
        ("d.md", b"kept"),
        ("e (conflict 2026-11-28 4CTITOD).txt", b"edit on A"),
        ("e.txt", b"kept"),
    ];
    let exported = |dest: &str| {
        let dest = f.tmp.path().join(dest).join("docs");
        let out = run(&f, &["export", s(&f.cipher), s(dest.parent().unwrap())]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(ls(&dest), want.map(|(n, _)| n));
        for (n, data) in want {
            assert_eq!(std::fs::read(dest.join(n)).unwrap(), data, "{n}");
        }
    };
    exported("before");
    let m = f.mounted(&[]);
    let docs = f.mnt.join("docs");
    // By name before any listing, then listed.
    assert_eq!(std::fs::read(docs.join(want[4].0)).unwrap(), b"edit on A");
    assert_eq!(ls(&docs), want.map(|(n, _)| n));
    for (n, data) in want {
        assert_eq!(std::fs::read(docs.join(n)).unwrap(), data, "{n}");
    }
    m.unmount();
    run(&f, &["fsck", "--repair", s(&f.cipher)]);
    // Merged (the copies stay copies: their originals are under the merged ID, which here is
    // the copy's, the one derived for docs).
    let out = run(&f, &["fsck", s(&f.cipher)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("several IDs"), "{text}");
    assert_eq!(text.matches("conflict_copy:").count(), 2, "{text}");
    exported("after");
}

/// `rekey` does not convert a sync client's conflict copy (its contents would stay under the
/// old key, its name would follow nothing): it refuses in one line, changing nothing.
#[test]
fn rekey_refuses_a_volume_holding_a_conflict_copy() {
    let f = Fixture::new();
    let copy = make_conflict(
        &f,
        "report.txt",
        b"edit on A",
        Some(b"edit on B"),
        syncthing,
        false,
    );
    let before = tree(&f.cipher);
    let out = run(&f, &["rekey", s(&f.cipher)]);
    assert_fails(&out, 2, "report (conflict 2026-11-28 4CTITOD).txt");
    assert_eq!(tree(&f.cipher), before);
    assert!(copy.exists());
}

/// Every backing path under `dir` with its content (files) or target (symlinks).
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                todo.push(p.clone());
                out.push((p, Vec::new()));
            } else if m.is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.push((p, t.into_os_string().into_encoded_bytes()));
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// One name made under both IDs of a directory: `export` writes both (the one named under
/// the ID-file copy under its conflict name, not over the other), and the mount, `name -d`
/// and `fsck` name it alike; `fsck --repair` renames it to that name, so the view stays.
#[test]
fn a_name_under_both_ids_is_exported_listed_and_repaired_under_one_conflict_name() {
    let f = Fixture::new();
    let a = two_ids(&f, &[("a.txt", b"made on B too")]);
    let shown = "a (conflict 2026-11-28 K64EJMH).txt";
    let want = [
        (shown, &b"made on A"[..]),
        ("a.txt", b"made on B too"),
        ("b.txt", b"made on B"),
    ];
    let exported = |dest: &Path| {
        let out = run(&f, &["export", s(&f.cipher), s(dest)]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(ls(&dest.join("docs")), want.map(|(n, _)| n));
        for (n, data) in want {
            assert_eq!(
                std::fs::read(dest.join("docs").join(n)).unwrap(),
                data,
                "{n}"
            );
        }
    };
    exported(&f.tmp.path().join("export"));
    let out = run(&f, &["name", "-d", s(&f.cipher), s(&a)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("/docs/{shown}\n")
    );
    let out = run(&f, &["fsck", s(&f.cipher)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "conflict copy of /docs/a.txt (Syncthing, 2026-11-28 15:15:00, device K64EJMH)"
        ),
        "{text}"
    );
    let m = f.mounted(&[]);
    let docs = f.mnt.join("docs");
    // By name before any listing, then listed.
    assert_eq!(std::fs::read(docs.join(shown)).unwrap(), b"made on A");
    assert_eq!(ls(&docs), want.map(|(n, _)| n));
    for (n, data) in want {
        assert_eq!(std::fs::read(docs.join(n)).unwrap(), data, "{n}");
    }
    m.unmount();
    run(&f, &["fsck", "--repair", s(&f.cipher)]);
    let out = run(&f, &["fsck", s(&f.cipher)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!f.cipher.join(a.parent().unwrap()).join(ID_COPY).exists());
    exported(&f.tmp.path().join("export2"));
}

/// Conflict copies whose shown label is the same (Syncthing copies of one file made the same
/// day by one device; a numbered ` (1)` and a Resilio `.Conflict1` copy) are listed under
/// distinct names, the same in the mount, `name -d` and `export`.
#[test]
fn copies_with_one_label_are_listed_under_distinct_names() {
    let f = Fixture::new();
    let at = |t: &'static str| move |n: &str| format!("{n}.sync-conflict-20261128-{t}-4CTITOD");
    let mut copies = vec![
        make_conflict(&f, "report.txt", b"copy 1", Some(b"x"), at("101010"), false),
        make_conflict(
            &f,
            "report.txt",
            b"copy 2",
            Some(b"kept"),
            at("121212"),
            false,
        ),
    ];
    copies.push(make_conflict(
        &f,
        "notes.md",
        b"n1",
        Some(b"x"),
        |n| format!("{n} (1)"),
        false,
    ));
    copies.push(make_conflict(
        &f,
        "notes.md",
        b"n2",
        Some(b"notes"),
        |n| format!("{n}.Conflict1"),
        false,
    ));
    let m = f.mounted(&[]);
    let listed = ls(&f.mnt);
    let mut distinct = listed.clone();
    distinct.dedup();
    assert_eq!(distinct, listed);
    assert_eq!(listed.len(), 6, "{listed:?}");
    let seen: Vec<Vec<u8>> = listed
        .iter()
        .map(|n| std::fs::read(f.mnt.join(n)).unwrap())
        .collect();
    let mut read = seen.clone();
    read.sort();
    assert_eq!(
        read,
        [&b"copy 1"[..], b"copy 2", b"kept", b"n1", b"n2", b"notes"]
    );
    m.unmount();
    let dest = f.tmp.path().join("export");
    let out = run(&f, &["export", s(&f.cipher), s(&dest)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(ls(&dest), listed);
    for c in &copies {
        let out = run(&f, &["name", "-d", s(&f.cipher), s(c)]);
        assert!(out.status.success(), "{}", stderr(&out));
        let name = String::from_utf8(out.stdout).unwrap();
        let name = name.trim_end().trim_start_matches('/');
        assert!(listed.iter().any(|l| l == name), "{name} not in {listed:?}");
        let i = listed.iter().position(|l| l == name).unwrap();
        assert_eq!(std::fs::read(dest.join(name)).unwrap(), seen[i], "{name}");
    }
}

/// A long name's conflict copy that came with a copy of its sidecar: deleting or renaming the
/// copy through the mount takes the sidecar's copy with it.
#[test]
fn a_long_copys_sidecar_copy_goes_with_it() {
    let f = Fixture::new();
    let long1 = format!("{}.txt", long_stem());
    make_conflict(&f, &long1, b"copy", Some(b"kept"), syncthing, true);
    let long2 = format!("{}2.md", long_stem());
    make_conflict(&f, &long2, b"only copy", None, syncthing, true);
    let left = || {
        ls(&f.cipher)
            .into_iter()
            .filter(|n| n.contains("sync-conflict"))
            .collect::<Vec<_>>()
    };
    assert_eq!(left().len(), 4);
    let m = f.mounted(&[]);
    let shown = |stem: &str, ext: &str| format!("{stem} (conflict 2026-11-28 4CTITOD){ext}");
    std::fs::remove_file(f.mnt.join(shown(&long_stem(), ".txt"))).unwrap();
    std::fs::rename(
        f.mnt.join(shown(&format!("{}2", long_stem()), ".md")),
        f.mnt.join(&long2),
    )
    .unwrap();
    assert_eq!(std::fs::read(f.mnt.join(&long1)).unwrap(), b"kept");
    assert_eq!(std::fs::read(f.mnt.join(&long2)).unwrap(), b"only copy");
    let mut want = vec![long1.clone(), long2.clone()];
    want.sort();
    assert_eq!(ls(&f.mnt), want);
    m.unmount();
    assert_eq!(left(), Vec::<String>::new());
    let out = run(&f, &["fsck", s(&f.cipher)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `fsck --repair` gives a directory it writes an ID for the ID derived from its parent's and
/// its name (FORMAT.md 9.2), not a random one, so two devices that repair the same volume
/// agree: an empty directory whose ID file is lost, and a directory with two IDs merged.
#[test]
fn repairs_on_two_devices_agree_on_directory_ids() {
    let f = Fixture::new();
    let a = two_ids(&f, &[("a.txt", b"made on B too")]);
    let v = volume(&f);
    let w = Writer::new(&v, &f.cipher);
    let empty = w.mkdir(Path::new("empty")).unwrap();
    drop(w);
    std::fs::remove_file(empty.join("cloakfs.dirid")).unwrap();
    // The other device: a copy of the cipher directory.
    let other = f.tmp.path().join("other");
    let cp = std::process::Command::new("cp")
        .args(["-a", s(&f.cipher), s(&other)])
        .status()
        .unwrap();
    assert!(cp.success());
    for c in [&f.cipher, &other] {
        run(&f, &["fsck", "--repair", s(c)]);
        let out = run(&f, &["fsck", s(c)]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let relative = |root: &Path| {
        tree(root)
            .into_iter()
            .map(|(p, data)| (p.strip_prefix(root).unwrap().to_path_buf(), data))
            .collect::<Vec<_>>()
    };
    assert_eq!(relative(&f.cipher), relative(&other));
    let root = v.root_dir_id();
    for (dir, name) in [(a.parent().unwrap(), "docs"), (empty.as_path(), "empty")] {
        let want = v.new_dir_id(&root, name.as_bytes());
        assert_eq!(
            std::fs::read(dir.join("cloakfs.dirid")).unwrap(),
            want.0,
            "{name}"
        );
    }
}
