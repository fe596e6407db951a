//! A volume in a folder that a sync client copies between two devices: two real Syncthing
//! instances on 127.0.0.1 (tests/common/syncthing.rs), each device mounting its copy.

mod common;

use common::syncthing::{Pair, SyncedVolume};
use std::path::Path;

/// Names of the regular files in `dir` that read back as written by `content_of`.
fn readable(dir: &Path, content_of: impl Fn(&str) -> String) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().into_string().unwrap())
        .filter(|n| std::fs::read_to_string(dir.join(n)).ok() == Some(content_of(n)))
        .collect();
    names.sort();
    names
}

fn content(name: &str) -> String {
    format!("contents of {name}\n")
}

/// The same new directory made on both devices while they are apart, 8 files each side,
/// without cloakfs: Syncthing keeps all 16 files (the baseline the volume must match).
#[test]
fn plain_folder_keeps_both_sides_files() {
    let pair = Pair::start();
    pair.pause();
    for (dev, side) in [(&pair.a, "a"), (&pair.b, "b")] {
        let dir = dev.folder.join("docs");
        std::fs::create_dir(&dir).unwrap();
        for i in 0..8 {
            let n = format!("{side}{i}.txt");
            std::fs::write(dir.join(&n), content(&n)).unwrap();
        }
    }
    pair.resume();
    pair.sync();
    for dev in [&pair.a, &pair.b] {
        let got = readable(&dev.folder.join("docs"), content);
        assert_eq!(got.len(), 16, "{}: {got:?}", dev.name);
    }
    pair.stop();
}

/// What each device's mount shows of a directory after the devices met.
struct Seen {
    a: Vec<String>,
    b: Vec<String>,
}

fn seen(vol: &SyncedVolume, dir: &str) -> Seen {
    Seen {
        a: readable(&vol.a.mnt.join(dir), content),
        b: readable(&vol.b.mnt.join(dir), content),
    }
}

/// Sync clients' copies of `cloakfs.dirid` in the backing folders of both devices.
fn id_file_copies(pair: &Pair) -> usize {
    pair.count_files(|n| n.starts_with("cloakfs") && n != "cloakfs.dirid" && n.contains("dirid"))
}

/// The case: the same new directory `docs` made through both mounts while the devices
/// are apart, 8 files each side; after they meet, one more file written on each side.
/// Returns what each mount shows before and after a remount, and prints the figures.
fn same_directory_on_both_devices(random_dir_ids: bool) -> (Seen, Seen, usize) {
    let pair = Pair::start();
    let vol = SyncedVolume::init(&pair);
    let mounts = vol.mount(random_dir_ids);
    pair.pause();
    for (f, side) in [(&vol.a, "a"), (&vol.b, "b")] {
        let dir = f.mnt.join("docs");
        std::fs::create_dir(&dir).unwrap();
        for i in 0..8 {
            let n = format!("{side}{i}.txt");
            std::fs::write(dir.join(&n), content(&n)).unwrap();
        }
    }
    pair.resume();
    pair.sync();
    // Written after the sync, on each device, with no remount.
    for (f, side) in [(&vol.a, "a"), (&vol.b, "b")] {
        let n = format!("late-{side}.txt");
        std::fs::write(f.mnt.join("docs").join(&n), content(&n)).unwrap();
    }
    pair.sync();
    let live = seen(&vol, "docs");
    let copies = id_file_copies(&pair);
    if std::env::var_os("SYNC_DEBUG").is_some() {
        let _ = std::process::Command::new("find")
            .arg(&pair.a.folder)
            .arg(&pair.b.folder)
            .status();
    }
    mounts.0.unmount();
    mounts.1.unmount();
    let mounts = vol.mount(random_dir_ids);
    let remounted = seen(&vol, "docs");
    drop(mounts);
    pair.stop();
    for (when, s) in [("live", &live), ("remounted", &remounted)] {
        eprintln!(
            "figures (random IDs {random_dir_ids}, {when}): made 18; readable on a {}, on b {}; \
             ID file copies {copies}",
            s.a.len(),
            s.b.len()
        );
    }
    (live, remounted, copies)
}

/// Derived directory IDs: both devices write the same `cloakfs.dirid`, Syncthing sees no
/// conflict, and every file of both devices is readable on both, with and without a remount.
#[test]
fn same_new_directory_on_both_devices_keeps_every_file() {
    let (live, remounted, copies) = same_directory_on_both_devices(false);
    assert_eq!(copies, 0, "Syncthing made a conflict copy of an ID file");
    for s in [&live, &remounted] {
        assert_eq!(s.a.len(), 18, "a: {:?}", s.a);
        assert_eq!(s.a, s.b);
    }
}

/// Directories with random IDs (as made before derived IDs): Syncthing replaces one device's
/// `cloakfs.dirid`; that device's mount follows without a remount, so both mounts show the
/// same entries and the files written after the sync on either device are readable on both.
#[test]
fn mounts_follow_a_replaced_directory_id() {
    let (live, _remounted, copies) = same_directory_on_both_devices(true);
    assert_eq!(
        copies, 2,
        "the case needs Syncthing's conflict copy of the ID file on each device"
    );
    assert_eq!(live.a, live.b, "the two mounts diverged");
    for late in ["late-a.txt", "late-b.txt"] {
        assert!(
            live.a.contains(&late.to_string()),
            "{late} not on a: {:?}",
            live.a
        );
    }
}

/// Directories with random IDs, after Syncthing's conflict: the entries the losing device
/// named under its ID (now in the ID file's copy) are listed and readable on both devices,
/// with and without a remount.
#[test]
fn entries_named_under_a_conflict_copy_of_the_id_are_shown() {
    let (live, remounted, copies) = same_directory_on_both_devices(true);
    assert_eq!(copies, 2);
    for s in [&live, &remounted] {
        assert_eq!(s.a.len(), 18, "a: {:?}", s.a);
        assert_eq!(s.a, s.b);
    }
}

/// Random IDs, and the winning side of the conflict is an empty directory (made later, so
/// Syncthing keeps its ID file): every file of the other side is listed (no EIO), readable,
/// writable, renamable and deletable through both mounts, and found by name after a remount
/// with no listing first.
#[test]
fn an_empty_winning_side_hides_nothing() {
    let pair = Pair::start();
    let vol = SyncedVolume::init(&pair);
    let mounts = vol.mount(true);
    pair.pause();
    let b_docs = vol.b.mnt.join("docs");
    std::fs::create_dir(&b_docs).unwrap();
    for i in 0..8 {
        let n = format!("b{i}.txt");
        std::fs::write(b_docs.join(&n), content(&n)).unwrap();
    }
    // Made after b's, so its ID file is the newer one and wins.
    std::fs::create_dir(vol.a.mnt.join("docs")).unwrap();
    pair.resume();
    pair.sync();
    assert_eq!(id_file_copies(&pair), 2, "the case needs the conflict copy");
    let s = seen(&vol, "docs");
    assert_eq!(s.a.len(), 8, "a: {:?}", s.a);
    assert_eq!(s.a, s.b);

    // Written, renamed and deleted through a's mount, where they are named under the copy.
    let a_docs = vol.a.mnt.join("docs");
    std::fs::write(a_docs.join("b0.txt"), content("b0.txt") + "more\n").unwrap();
    std::fs::rename(a_docs.join("b1.txt"), a_docs.join("renamed.txt")).unwrap();
    std::fs::remove_file(a_docs.join("b2.txt")).unwrap();
    pair.sync();
    mounts.0.unmount();
    mounts.1.unmount();
    let _mounts = vol.mount(true);
    for f in [&vol.a, &vol.b] {
        let docs = f.mnt.join("docs");
        // By name first: the lookup finds what the listing has not shown yet.
        assert_eq!(
            std::fs::read_to_string(docs.join("b3.txt")).unwrap(),
            content("b3.txt")
        );
        assert_eq!(
            std::fs::read_to_string(docs.join("b0.txt")).unwrap(),
            content("b0.txt") + "more\n"
        );
        assert_eq!(
            std::fs::read_to_string(docs.join("renamed.txt")).unwrap(),
            content("b1.txt")
        );
        assert!(!docs.join("b1.txt").exists());
        assert!(!docs.join("b2.txt").exists());
        let mut names: Vec<String> = std::fs::read_dir(&docs)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "b0.txt",
                "b3.txt",
                "b4.txt",
                "b5.txt",
                "b6.txt",
                "b7.txt",
                "renamed.txt"
            ]
        );
    }
}

/// Random IDs, and one name made on both sides: `fsck` names the directory with several IDs,
/// `fsck --repair` merges them (the name taken on both sides keeps the conflict name the
/// mounts showed it under, `same (conflict DATE DEVICE).txt` after the ID file's copy), after
/// which `fsck` is clean and both devices see every file under one ID.
#[test]
fn fsck_repair_merges_a_directory_with_several_ids() {
    let pair = Pair::start();
    let vol = SyncedVolume::init(&pair);
    let mounts = vol.mount(true);
    pair.pause();
    for (f, side) in [(&vol.a, "a"), (&vol.b, "b")] {
        let dir = f.mnt.join("docs");
        std::fs::create_dir(&dir).unwrap();
        for i in 0..4 {
            let n = format!("{side}{i}.txt");
            std::fs::write(dir.join(&n), content(&n)).unwrap();
        }
        std::fs::write(dir.join("same.txt"), format!("from {side}\n")).unwrap();
    }
    pair.resume();
    pair.sync();
    // While the two IDs stand, the mount shows both `same.txt`, the one named under the ID
    // file's copy under a conflict name (never two entries of one name).
    let listed: Vec<String> = std::fs::read_dir(vol.a.mnt.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(listed.len(), 10, "{listed:?}");
    let shown: Vec<&String> = listed
        .iter()
        .filter(|n| n.starts_with("same (conflict "))
        .collect();
    assert_eq!(shown.len(), 1, "{listed:?}");
    let shown = shown[0].clone();
    mounts.0.unmount();
    mounts.1.unmount();

    let fsck = |extra: &[&str]| {
        vol.a.run(
            &[
                &["fsck", "--passfile", common::s(&vol.a.pass)][..],
                extra,
                &[common::s(&vol.a.cipher)],
            ]
            .concat(),
        )
    };
    let out = fsck(&[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("several IDs") && text.contains("/docs"),
        "{text}"
    );
    assert!(!text.contains("does not decrypt"), "{text}");
    let out = fsck(&["--repair"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("[repaired]"),
        "{text}{}",
        common::stderr(&out)
    );
    let out = fsck(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    pair.sync();
    assert_eq!(id_file_copies(&pair), 0);

    let _mounts = vol.mount(true);
    for f in [&vol.a, &vol.b] {
        let docs = f.mnt.join("docs");
        let mut names = readable(&docs, content);
        names.sort();
        assert_eq!(names.len(), 8, "{names:?}");
        let mut same: Vec<String> = ["same.txt", shown.as_str()]
            .iter()
            .map(|n| std::fs::read_to_string(docs.join(n)).unwrap())
            .collect();
        same.sort();
        assert_eq!(same, ["from a\n", "from b\n"]);
        assert_eq!(std::fs::read_dir(&docs).unwrap().count(), 10);
    }
}
