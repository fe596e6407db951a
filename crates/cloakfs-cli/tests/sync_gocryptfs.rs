//! The sync-folder cases of sync_folder.rs and conflicts.rs played against gocryptfs (Debian's
//! package, default settings) for docs/COMPARISON.md: two real Syncthing instances on
//! 127.0.0.1 (tests/common/syncthing.rs), one gocryptfs volume in their folder, each device
//! mounting its copy with `gocryptfs -passfile P CIPHER MNT`.
//!
//! Each case counts, per device, the versions of files made that its mount shows (readable),
//! that its backing folder holds but the mount does not show (hidden), and that are gone
//! (lost), live and after a remount, and prints one `figures:` line for each. What gocryptfs
//! does is asserted only loosely: the counts add up, and whatever the mount shows is on disk.
//! Slow (many Syncthing rounds): they run with CLOAKFS_SLOW_TESTS=1 only.

mod common;

use common::gocryptfs::contents;
use common::syncthing::{Pair, SyncedVolume, FOLDER};
use common::{Fixture, MountGuard};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// Longer than the kernel keeps gocryptfs's entries and attributes (1 s).
const SETTLE: Duration = Duration::from_secs(2);
/// Longer than gocryptfs keeps directory IVs it read: its cache of them is cleared every 60 s,
/// so until then a mount may go on naming entries under an IV the sync client replaced.
const IV_CACHE: Duration = Duration::from_secs(61);

fn content(name: &str) -> String {
    format!("contents of {name}\n")
}

/// What both mounts show, once they have shown the same for `window`: a figure is not one of
/// a cache that has not expired yet.
fn settled(vol: &SyncedVolume, window: Duration) -> (BTreeSet<String>, BTreeSet<String>) {
    let look = || (contents(&vol.a.mnt), contents(&vol.b.mnt));
    let mut last = look();
    let start = Instant::now();
    let mut since = start;
    while since.elapsed() < window {
        assert!(
            start.elapsed() < 2 * window + Duration::from_secs(60),
            "the mounts never showed the same for {window:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
        let now = look();
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
    last
}

/// One device's figures: of the versions made, how many its mount shows, how many its backing
/// folder holds without the mount showing them, and how many are gone.
struct Count {
    readable: usize,
    hidden: usize,
    lost: usize,
}

fn count(made: &BTreeSet<String>, shown: &BTreeSet<String>, on_disk: &BTreeSet<String>) -> Count {
    let readable = made.intersection(shown).count();
    let hidden = made
        .difference(shown)
        .filter(|c| on_disk.contains(*c))
        .count();
    let lost = made.len() - readable - hidden;
    assert!(
        shown.is_subset(on_disk),
        "the mount shows what the disk does not hold: {:?}",
        shown.difference(on_disk).collect::<Vec<_>>()
    );
    assert_eq!(readable + hidden + lost, made.len());
    Count {
        readable,
        hidden,
        lost,
    }
}

/// Sync clients' copies of `gocryptfs.diriv` in the backing folders of both devices.
fn iv_file_copies(pair: &Pair) -> usize {
    pair.count_files(|n| {
        n.starts_with("gocryptfs") && n != "gocryptfs.diriv" && n.contains("diriv")
    })
}

/// Whether the comparison runs here (slow tests on, gocryptfs installed); says why not.
fn runs_here() -> bool {
    if !common::slow() {
        eprintln!("skipped: the gocryptfs sync-folder comparison runs with CLOAKFS_SLOW_TESTS=1");
        return false;
    }
    common::gocryptfs::available()
}

/// Two devices with a gocryptfs volume in their folder, mounted on both; `None` (said why)
/// where the comparison does not run.
fn start() -> Option<(Pair, SyncedVolume, (MountGuard, MountGuard))> {
    if !runs_here() {
        return None;
    }
    let pair = Pair::start();
    let vol = SyncedVolume::init_gocryptfs(&pair);
    let mounts = vol.mount_gocryptfs(&[]);
    Some((pair, vol, mounts))
}

/// Prints the figures of a case: live (both mounts as they are, right away and once
/// gocryptfs's cache of directory IVs was cleared), after a remount, and with
/// `-badname '*'` (gocryptfs's way to show names that do not decrypt); then unmounts.
fn report(
    case: &str,
    pair: &Pair,
    vol: &SyncedVolume,
    mounts: (MountGuard, MountGuard),
    made: &BTreeSet<String>,
    extra: &str,
) {
    let live = settled(vol, SETTLE);
    let later = settled(vol, IV_CACHE);
    mounts.0.unmount_fuse();
    mounts.1.unmount_fuse();
    let mounts = vol.mount_gocryptfs(&[]);
    let remounted = settled(vol, SETTLE);
    mounts.0.unmount_fuse();
    mounts.1.unmount_fuse();
    let mounts = vol.mount_gocryptfs(&["-ro", "-badname", "*"]);
    let badname = (contents(&vol.a.mnt), contents(&vol.b.mnt));
    mounts.0.unmount_fuse();
    mounts.1.unmount_fuse();
    let on_disk = (vol.a.gocryptfs_on_disk(), vol.b.gocryptfs_on_disk());
    let copies = iv_file_copies(pair);
    for (when, shown) in [
        ("live", &live),
        ("a minute later", &later),
        ("remounted", &remounted),
        ("-badname '*'", &badname),
    ] {
        let a = count(made, &shown.0, &on_disk.0);
        let b = count(made, &shown.1, &on_disk.1);
        eprintln!(
            "figures: gocryptfs, {case} ({when}): made {}; a: readable {}, hidden {}, lost {}; \
             b: readable {}, hidden {}, lost {}; diriv copies {copies}{extra}",
            made.len(),
            a.readable,
            a.hidden,
            a.lost,
            b.readable,
            b.hidden,
            b.lost,
        );
    }
}

/// Writes `dir/NAME` for each name, with `content(NAME)`, making `dir`.
fn make_files(dir: &Path, names: &[String]) {
    std::fs::create_dir(dir).unwrap();
    for n in names {
        std::fs::write(dir.join(n), content(n)).unwrap();
    }
}

fn side_names(side: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{side}{i}.txt")).collect()
}

/// sync_folder.rs's case: the same new directory `docs` made through both mounts while the
/// devices are apart, 8 files each side; after they meet, one more file written on each side.
#[test]
fn gocryptfs_same_new_directory_on_both_devices() {
    let Some((pair, vol, mounts)) = start() else {
        return;
    };
    pair.pause();
    let mut made = BTreeSet::new();
    for (f, side) in [(&vol.a, "a"), (&vol.b, "b")] {
        let names = side_names(side, 8);
        make_files(&f.mnt.join("docs"), &names);
        made.extend(names.iter().map(|n| content(n)));
    }
    pair.resume();
    pair.sync();
    for (f, side) in [(&vol.a, "a"), (&vol.b, "b")] {
        let n = format!("late-{side}.txt");
        std::fs::write(f.mnt.join("docs").join(&n), content(&n)).unwrap();
        made.insert(content(&n));
    }
    pair.sync();
    report("same new directory", &pair, &vol, mounts, &made, "");
    pair.stop();
}

/// sync_folder.rs's `an_empty_winning_side_hides_nothing`: b makes `docs` with 8 files, a
/// makes an empty `docs` later (its IV file is newer and wins). Then, through a's mount, the
/// cloakfs test's edits: b0.txt rewritten, b1.txt renamed, b2.txt removed.
#[test]
fn gocryptfs_an_empty_winning_side() {
    let Some((pair, vol, mounts)) = start() else {
        return;
    };
    pair.pause();
    let names = side_names("b", 8);
    make_files(&vol.b.mnt.join("docs"), &names);
    std::fs::create_dir(vol.a.mnt.join("docs")).unwrap();
    pair.resume();
    pair.sync();
    let made: BTreeSet<String> = names.iter().map(|n| content(n)).collect();
    // The cloakfs test's edits through a's mount, each one's outcome.
    let a_docs = vol.a.mnt.join("docs");
    settled(&vol, SETTLE);
    let outcome = |r: std::io::Result<()>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("{:?}", e.kind()),
    };
    let listed_before = std::fs::read_dir(&a_docs).map_or(0, |d| d.count());
    let edits = format!(
        "; through a: listed {listed_before}, read b3.txt {}, write b0.txt {}, \
         rename b1.txt {}, remove b2.txt {}",
        outcome(std::fs::read(a_docs.join("b3.txt")).map(drop)),
        outcome(std::fs::write(
            a_docs.join("b0.txt"),
            content("b0.txt") + "more\n"
        )),
        outcome(std::fs::rename(
            a_docs.join("b1.txt"),
            a_docs.join("renamed.txt")
        )),
        outcome(std::fs::remove_file(a_docs.join("b2.txt"))),
    );
    pair.sync();
    report("empty winning side", &pair, &vol, mounts, &made, &edits);
    pair.stop();
}

/// sync_folder.rs's `fsck_repair_merges_a_directory_with_several_ids`: 4 files each side and
/// `same.txt` made on both; then `gocryptfs -fsck` on a's copy (gocryptfs has no repair).
#[test]
fn gocryptfs_same_name_on_both_sides_and_fsck() {
    let Some((pair, vol, mounts)) = start() else {
        return;
    };
    pair.pause();
    let mut made = BTreeSet::new();
    for (f, side) in [(&vol.a, "a"), (&vol.b, "b")] {
        let names = side_names(side, 4);
        let dir = f.mnt.join("docs");
        make_files(&dir, &names);
        made.extend(names.iter().map(|n| content(n)));
        let same = format!("same.txt from {side}\n");
        std::fs::write(dir.join("same.txt"), &same).unwrap();
        made.insert(same);
    }
    pair.resume();
    pair.sync();
    let listed = std::fs::read_dir(vol.a.mnt.join("docs")).map_or(0, |d| d.count());
    // The figures first (they unmount), then fsck on the unmounted copy.
    report(
        "same name on both sides",
        &pair,
        &vol,
        mounts,
        &made,
        &format!("; a listed {listed}"),
    );
    let (code, summary) = vol.a.gocryptfs_fsck();
    eprintln!("figures: gocryptfs, same name on both sides (fsck): exit {code}; {summary}");
    pair.stop();
}

fn long_stem() -> String {
    "a-long-report-name-".repeat(10)
}

/// conflicts.rs's Syncthing case: both devices edit one file (a short and a long name) while
/// apart; Syncthing keeps one edit of each and saves the other as a conflict copy of the
/// encrypted name.
#[test]
fn gocryptfs_syncthing_conflict_copies() {
    let Some((pair, vol, mounts)) = start() else {
        return;
    };
    let names = ["report.txt".to_string(), format!("{}.txt", long_stem())];
    for n in &names {
        std::fs::write(vol.a.mnt.join(n), b"first").unwrap();
    }
    pair.sync();
    pair.pause();
    let mut made = BTreeSet::new();
    for (f, side) in [(&vol.a, "A"), (&vol.b, "B")] {
        for n in &names {
            let edit = format!("edit on {side} of {n}");
            std::fs::write(f.mnt.join(n), &edit).unwrap();
            made.insert(edit);
        }
    }
    // Each side indexes its own edit while apart, so Syncthing sees two concurrent versions.
    let scan = format!("/rest/db/scan?folder={FOLDER}");
    pair.a.request("POST", &scan);
    pair.b.request("POST", &scan);
    pair.resume();
    pair.sync();
    let copies = |f: &Fixture| {
        let mut n = 0;
        for e in std::fs::read_dir(&f.cipher).unwrap().map(Result::unwrap) {
            n += usize::from(e.file_name().to_string_lossy().contains(".sync-conflict-"));
        }
        n
    };
    let extra = format!(
        "; conflict copies in the backing folder: a {}, b {}",
        copies(&vol.a),
        copies(&vol.b)
    );
    report("conflict copies", &pair, &vol, mounts, &made, &extra);
    pair.stop();
}

/// conflicts.rs's other clients, without a sync client running: a file's backing entry renamed
/// as each client names its conflict copy, and the file written again, on one gocryptfs
/// volume.
#[test]
fn gocryptfs_other_clients_conflict_copies() {
    if !runs_here() {
        return;
    }
    type Rename = fn(&str) -> String;
    let clients: [(&str, Rename); 7] = [
        ("syncthing", |n| {
            format!("{n}.sync-conflict-20261128-101010-4CTITOD")
        }),
        ("dropbox", |n| {
            format!("{n} (Ann's conflicted copy 2026-11-28)")
        }),
        ("nextcloud", |n| {
            format!("{n} (conflicted copy 2026-11-28 101010)")
        }),
        ("owncloud", |n| format!("{n}_conflict-20261128-101010")),
        ("onedrive", |n| format!("{n}-LAPTOP-7")),
        ("resilio", |n| format!("{n}.Conflict")),
        ("gdrive", |n| format!("{n} (1)")),
    ];
    let f = Fixture::bare();
    f.gocryptfs_init();
    let backing = || -> BTreeSet<String> {
        std::fs::read_dir(&f.cipher)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    let mut made = BTreeSet::new();
    let mut shown_per_client = Vec::new();
    for (client, rename) in &clients {
        let plain = format!("{client}.txt");
        let m = f.gocryptfs_mounted(&[]);
        let before = backing();
        let theirs = format!("their edit of {plain}");
        std::fs::write(f.mnt.join(&plain), &theirs).unwrap();
        let name = backing().difference(&before).next().unwrap().clone();
        m.unmount_fuse();
        std::fs::rename(f.cipher.join(&name), f.cipher.join(rename(&name))).unwrap();
        let m = f.gocryptfs_mounted(&[]);
        let mine = format!("my edit of {plain}");
        std::fs::write(f.mnt.join(&plain), &mine).unwrap();
        m.unmount_fuse();
        made.insert(theirs.clone());
        made.insert(mine);
        let m = f.gocryptfs_mounted(&["-ro", "-badname", "*"]);
        shown_per_client.push(format!(
            "{client} {}",
            if contents(&f.mnt).contains(&theirs) {
                "shown"
            } else {
                "not shown"
            }
        ));
        m.unmount_fuse();
    }
    let m = f.gocryptfs_mounted(&[]);
    let shown = contents(&f.mnt);
    m.unmount_fuse();
    let m = f.gocryptfs_mounted(&["-ro", "-badname", "*"]);
    let badname = contents(&f.mnt);
    m.unmount_fuse();
    let on_disk = f.gocryptfs_on_disk();
    for (when, shown) in [("mounted", &shown), ("-badname '*'", &badname)] {
        let c = count(&made, shown, &on_disk);
        eprintln!(
            "figures: gocryptfs, other clients' conflict copies ({when}): made {}; readable {}, \
             hidden {}, lost {}",
            made.len(),
            c.readable,
            c.hidden,
            c.lost
        );
    }
    eprintln!(
        "figures: gocryptfs, other clients' copies with -badname '*': {}",
        shown_per_client.join(", ")
    );
}
