//! The offline tools end to end: `cloakfs cat`, `name`, `fsck`, `export` and `rekey` on real
//! cipher directories, built with the core APIs (no mount needed), including tampering and
//! rekeys killed at many points and then resumed or rolled back.

mod common;

use cloakfs_core::crypto::secret::Passphrase;
use cloakfs_core::tools::writer::Writer;
use cloakfs_core::Volume;
use common::*;
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PASS: &[u8] = b"correct horse battery";

fn long_name() -> String {
    "a-rather-long-file-name-".repeat(9)
}

/// A volume with files (one of several MiB), directories, a long name, symlinks, a fifo, a
/// hard link and xattrs, and the plaintext contents of its files.
struct Vol {
    f: Fixture,
    files: BTreeMap<PathBuf, Vec<u8>>,
}

impl Vol {
    fn new() -> Self {
        let f = Fixture::new();
        let v = f.volume();
        let w = Writer::new(&v, &f.cipher);
        let mut files = BTreeMap::new();
        let big: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i % 251) as u8 ^ (i >> 12) as u8)
            .collect();
        w.mkdir_all(Path::new("docs/sub/deeper")).unwrap();
        w.mkdir(Path::new("empty")).unwrap();
        let mut add = |p: &str, d: Vec<u8>| {
            w.write_file(Path::new(p), &d).unwrap();
            files.insert(PathBuf::from(p), d);
        };
        add("hello.txt", b"hello, world\n".to_vec());
        add("docs/big.bin", big);
        add("docs/sub/notes.md", b"# notes\n".repeat(1000));
        add("docs/sub/deeper/one", vec![1]);
        add("empty-file", Vec::new());
        for i in 0..20 {
            add(
                &format!("docs/small-{i:02}"),
                format!("file {i}\n").repeat(i * 50).into_bytes(),
            );
        }
        add(&format!("docs/{}", long_name()), b"long named\n".to_vec());
        w.symlink(Path::new("docs/link-to-notes"), b"sub/notes.md")
            .unwrap();
        w.symlink(Path::new("abs-link"), b"/etc/hostname").unwrap();
        w.mkfifo(Path::new("docs/pipe")).unwrap();
        w.hard_link(Path::new("hello.txt"), Path::new("docs/sub/hello-link"))
            .unwrap();
        files.insert("docs/sub/hello-link".into(), b"hello, world\n".to_vec());
        w.set_xattr(Path::new("hello.txt"), b"user.comment", b"greeting")
            .unwrap();
        w.set_xattr(Path::new("docs"), b"user.dir-note", b"a directory xattr")
            .unwrap();
        let notes = w.backing(Path::new("docs/sub/notes.md")).unwrap();
        std::fs::set_permissions(&notes, std::fs::Permissions::from_mode(0o640)).unwrap();
        Self { f, files }
    }

    fn c(&self) -> &str {
        s(&self.f.cipher)
    }

    fn p(&self) -> &str {
        s(&self.f.pass)
    }

    /// Runs `cloakfs CMD --passfile PASS REST...` with the fixture's record of known volumes.
    fn run(&self, args: &[&str]) -> Output {
        let (cmd, rest) = args.split_first().unwrap();
        self.bin()
            .args([&[*cmd, "--passfile", self.p()], rest].concat())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    }

    fn bin(&self) -> Command {
        self.f.bin()
    }

    fn backing(&self, plain: &str) -> PathBuf {
        let v = self.f.volume();
        Writer::new(&v, &self.f.cipher)
            .backing(Path::new(plain))
            .unwrap()
    }

    /// Exports the volume and checks every file, symlink and the xattrs.
    fn check_contents(&self) {
        let dest = self.f.tmp.path().join(format!("export-{}", rand_suffix()));
        let out = self.run(&["export", self.c(), s(&dest)]);
        assert!(out.status.success(), "export: {}", stderr(&out));
        for (p, d) in &self.files {
            assert_eq!(&std::fs::read(dest.join(p)).unwrap(), d, "{p:?}");
        }
        assert_eq!(
            std::fs::read_link(dest.join("docs/link-to-notes")).unwrap(),
            Path::new("sub/notes.md")
        );
        assert_eq!(
            xattr(&dest.join("hello.txt"), "user.comment").as_deref(),
            Some(&b"greeting"[..])
        );
        std::fs::remove_dir_all(dest).unwrap();
    }
}

trait FixtureExt {
    fn volume(&self) -> Volume;
}

impl FixtureExt for Fixture {
    fn volume(&self) -> Volume {
        Volume::unlock(&self.cipher, &Passphrase::new(PASS.to_vec())).unwrap()
    }
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let out = Command::new("getfattr")
        .args(["--only-values", "-n", name])
        .arg(p)
        .output()
        .ok()?;
    if out.status.success() {
        Some(out.stdout)
    } else {
        // getfattr missing: read it with the core helper instead
        cloakfs_core::io::xattrs::get(p, name.as_bytes()).ok()
    }
}

fn flip_byte(p: &Path, off: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, off).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], off).unwrap();
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn kinds(report: &serde_json::Value) -> Vec<String> {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap().to_string())
        .collect()
}

// ---------------------------------------------------------------- cat

#[test]
fn cat_by_plain_path_long_name_symlink_and_raw() {
    let v = Vol::new();
    for (p, d) in &v.files {
        let out = v.run(&["cat", v.c(), s(p)]);
        assert!(out.status.success(), "{p:?}: {}", stderr(&out));
        assert_eq!(&out.stdout, d, "{p:?}");
    }
    let out = v.run(&["cat", v.c(), "/docs/link-to-notes"]);
    assert_eq!(out.stdout, v.files[Path::new("docs/sub/notes.md")]);
    assert_fails(&v.run(&["cat", v.c(), "abs-link"]), 2, "outside the volume");
    assert_fails(&v.run(&["cat", v.c(), "docs"]), 2, "is a directory");
    assert_fails(&v.run(&["cat", v.c(), "nope.txt"]), 5, "no such file");
    // --raw: the backing file alone; the volume is found by walking up, or given.
    let big = v.backing("docs/big.bin");
    let out = v.run(&["cat", "--raw", s(&big)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, v.files[Path::new("docs/big.bin")]);
    let copy = v.f.tmp.path().join("detached-copy");
    std::fs::copy(v.backing(&format!("docs/{}", long_name())), &copy).unwrap();
    assert_fails(&v.run(&["cat", "--raw", s(&copy)]), 3, "--volume");
    let out = v.run(&["cat", "--raw", s(&copy), "--volume", v.c()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, b"long named\n");
    // wrong passphrase
    let wrong = v.f.write_pass("wrong");
    let out = cloakfs(&["cat", "--passfile", s(&wrong), v.c(), "hello.txt"]);
    assert_fails(&out, 1, "wrong passphrase");
}

#[test]
fn cat_stops_before_a_tampered_block() {
    let v = Vol::new();
    let big = v.backing("docs/big.bin");
    flip_byte(&big, 18 + 700 * 4124 + 100);
    let out = v.run(&["cat", v.c(), "docs/big.bin"]);
    assert_fails(&out, 6, "block 700 fails authentication");
    assert_eq!(
        out.stdout.len(),
        700 * 4096,
        "everything before the bad block"
    );
    assert_eq!(
        &out.stdout[..],
        &v.files[Path::new("docs/big.bin")][..700 * 4096]
    );
    let out = v.run(&["cat", "--raw", s(&big)]);
    assert_fails(&out, 6, "block 700");
    // A file cut inside its last block, leaving fewer bytes than a block's overhead.
    let notes = v.backing("docs/sub/notes.md");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&notes)
        .unwrap()
        .set_len(18 + 4124 + 10)
        .unwrap();
    let out = v.run(&["cat", v.c(), "docs/sub/notes.md"]);
    assert_fails(&out, 6, "last block is cut short");
    assert_eq!(out.stdout.len(), 4096);
}

// ---------------------------------------------------------------- name

#[test]
fn name_translates_both_ways_including_long_names() {
    let v = Vol::new();
    for p in ["hello.txt", "docs/sub/deeper/one", "docs", "docs/pipe"] {
        let out = v.run(&["name", v.c(), p]);
        assert!(out.status.success(), "{}", stderr(&out));
        let backing = String::from_utf8(out.stdout).unwrap();
        let backing = backing.trim_end();
        assert!(Path::new(backing).exists(), "{backing}");
        assert!(!backing.contains("hello"));
        let out = v.run(&["name", "--decrypt", v.c(), backing]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("/{p}\n"));
    }
    let long = format!("docs/{}", long_name());
    let out = v.run(&["name", v.c(), &long]);
    let backing = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
    assert!(backing.contains("/cloakfs.long."), "{backing}");
    assert!(stderr(&out).contains("sidecar"), "{}", stderr(&out));
    // relative to the cipher directory, the entry and its sidecar
    let rel = Path::new(&backing)
        .strip_prefix(&v.f.cipher)
        .unwrap()
        .to_path_buf();
    for q in [
        rel.clone(),
        PathBuf::from(format!("{}.name", rel.display())),
    ] {
        let out = v.run(&["name", "-d", v.c(), s(&q)]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("/{long}\n"));
    }
    // A name that does not exist yet still translates (its directory must exist).
    let out = v.run(&["name", v.c(), "docs/not-yet"]);
    assert!(out.status.success());
    assert_fails(
        &v.run(&["name", v.c(), "missing/dir/x"]),
        5,
        "no such directory",
    );
    assert_fails(
        &v.run(&["name", "-d", v.c(), "cloakfs.conf"]),
        2,
        "cloakfs's own files",
    );
    assert_fails(
        &v.run(&["name", "-d", v.c(), "/etc/passwd"]),
        2,
        "not inside",
    );
    let bogus = v.f.cipher.join("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    assert_fails(
        &v.run(&["name", "-d", v.c(), s(&bogus)]),
        5,
        "does not decrypt",
    );
    // Encrypted names are base64url: one that begins with '-' is a path, not a flag.
    let dash = v.f.cipher.join("-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    std::fs::write(&dash, b"").unwrap();
    assert_fails(
        &v.run(&["name", "-d", v.c(), "-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"]),
        5,
        "does not decrypt",
    );
}

// ---------------------------------------------------------------- fsck

#[test]
fn fsck_clean_volume_exits_0_with_json() {
    let v = Vol::new();
    let out = v.run(&["fsck", v.c()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no problems"), "{text}");
    let out = v.run(&["fsck", "--json", v.c()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r = json(&out);
    assert_eq!(r["clean"], true);
    assert_eq!(r["counts"]["files"], 27);
    assert_eq!(r["counts"]["symlinks"], 2);
    assert_eq!(r["counts"]["directories"], 5);
    assert_eq!(r["counts"]["xattrs"], 2);
    assert_eq!(r["problems"].as_array().unwrap().len(), 0);
}

#[test]
fn fsck_detects_each_problem_and_repairs_the_fixable_ones() {
    let v = Vol::new();
    let vol = v.f.volume();
    let w = Writer::new(&vol, &v.f.cipher);
    // 1. a flipped block
    flip_byte(&v.backing("docs/big.bin"), 18 + 3 * 4124 + 7);
    // 2. a file cut inside its last block (to fewer bytes than the block overhead)
    let notes = v.backing("docs/sub/notes.md");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&notes)
        .unwrap()
        .set_len(18 + 4124 + 3)
        .unwrap();
    // 3. a tampered name
    let one = v.backing("docs/small-07");
    let mut n = one.file_name().unwrap().as_bytes().to_vec();
    n[5] = if n[5] == b'A' { b'B' } else { b'A' };
    std::fs::rename(&one, one.with_file_name(std::ffi::OsStr::from_bytes(&n))).unwrap();
    // 4. an orphaned long-name sidecar (its entry is gone)
    w.write_file(&Path::new("docs").join("o".repeat(200)), b"x")
        .unwrap();
    let orphan = v.backing(&format!("docs/{}", "o".repeat(200)));
    std::fs::remove_file(&orphan).unwrap();
    // 5. an empty directory without its ID, and a non-empty one
    std::fs::remove_file(v.backing("empty").join("cloakfs.dirid")).unwrap();
    std::fs::remove_file(v.backing("docs/sub/deeper").join("cloakfs.dirid")).unwrap();
    // 6. a symlink whose target does not decrypt
    let link = v.backing("docs/link-to-notes");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", &link)
        .unwrap();
    // 7. stray temporaries of a config write and of a rekey
    std::fs::write(v.f.cipher.join("cloakfs.conf.tmp.4000000"), "{}").unwrap();
    std::fs::write(
        v.backing("docs").join("cloakfs.rekey.tmp.00ff00ff00ff00ff"),
        "x",
    )
    .unwrap();
    // 8. a tampered xattr value
    let hello = v.backing("hello.txt");
    let names = cloakfs_core::io::xattrs::list(&hello).unwrap();
    let stored = names.iter().find(|n| n.starts_with(b"user.")).unwrap();
    let mut val = cloakfs_core::io::xattrs::get(&hello, stored).unwrap();
    val[20] ^= 1;
    cloakfs_core::io::xattrs::set(&hello, stored, &val).unwrap();
    // 9. a truncated header
    std::fs::write(v.backing("docs/small-03"), b"\x00\x01abc").unwrap();

    let out = v.run(&["fsck", "--json", v.c()]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let r = json(&out);
    assert_eq!(r["clean"], false);
    let mut k = kinds(&r);
    k.sort();
    let mut want = vec![
        "block",
        "truncated",
        "name",
        "orphan_sidecar",
        "dirid_missing",
        "dirid_missing",
        "symlink",
        "stray_temp",
        "stray_temp",
        "xattr",
        "header",
    ];
    want.sort();
    assert_eq!(k, want, "{r:#}");
    let by_kind = |kind: &str| -> Vec<serde_json::Value> {
        r["problems"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["kind"] == kind)
            .cloned()
            .collect()
    };
    assert_eq!(by_kind("block")[0]["plain"], "/docs/big.bin");
    assert!(by_kind("block")[0]["detail"]
        .as_str()
        .unwrap()
        .contains("block 3"));
    assert_eq!(by_kind("truncated")[0]["plain"], "/docs/sub/notes.md");
    assert_eq!(by_kind("symlink")[0]["plain"], "/docs/link-to-notes");
    assert_eq!(by_kind("xattr")[0]["plain"], "/hello.txt");
    assert_eq!(by_kind("name")[0]["plain_dir"], "/docs");
    let dirids = by_kind("dirid_missing");
    let empty = dirids.iter().find(|p| p["plain"] == "/empty").unwrap();
    assert_eq!(empty["repairable"], true);
    let full = dirids
        .iter()
        .find(|p| p["plain"] == "/docs/sub/deeper")
        .unwrap();
    assert_eq!(full["repairable"], false);
    for p in r["problems"].as_array().unwrap() {
        let fixable =
            ["orphan_sidecar", "stray_temp"].contains(&p["kind"].as_str().unwrap()) || p == empty;
        assert_eq!(p["repairable"], fixable, "{p}");
        assert!(p["backing"].as_str().unwrap().starts_with(v.c()));
    }

    // Human output: one line per problem with its plaintext path, and the summary.
    let out = v.run(&["fsck", v.c()]);
    assert_fails(&out, 6, "11 problems found (4 repairable with --repair)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("/docs/big.bin: block:"), "{text}");

    // Repair fixes exactly the fixable ones; nothing holding data is touched.
    let before = std::fs::read_dir(v.backing("docs")).unwrap().count();
    let out = v.run(&["fsck", "--repair", "--json", v.c()]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let r = json(&out);
    assert_eq!(r["counts"]["repaired"], 4);
    assert!(v.backing("empty").join("cloakfs.dirid").exists());
    assert!(!v.f.cipher.join("cloakfs.conf.tmp.4000000").exists());
    assert!(v.backing("docs/big.bin").exists());
    let after = std::fs::read_dir(v.backing("docs")).unwrap().count();
    assert_eq!(after + 2, before, "sidecar and temp removed");
    let out = v.run(&["fsck", "--json", v.c()]);
    let mut k = kinds(&json(&out));
    k.sort();
    assert_eq!(
        k,
        vec![
            "block",
            "dirid_missing",
            "header",
            "name",
            "symlink",
            "truncated",
            "xattr"
        ]
    );
}

#[test]
fn fsck_repair_of_only_fixable_problems_exits_7_then_0() {
    let v = Vol::new();
    std::fs::remove_file(v.backing("empty").join("cloakfs.dirid")).unwrap();
    std::fs::write(v.f.cipher.join("cloakfs.conf.tmp.4000001"), "{}").unwrap();
    std::fs::write(v.f.cipher.join("cloakfs.dirid"), [0u8; 16]).unwrap();
    // A directory the mount was still building (its ID written, not yet renamed into place).
    let half = v.backing("docs").join("cloakfs.tmp.0011223344556677");
    std::fs::create_dir(&half).unwrap();
    std::fs::write(half.join("cloakfs.dirid"), [7u8; 16]).unwrap();
    let out = v.run(&["fsck", v.c()]);
    assert_fails(&out, 6, "4 problems found (4 repairable with --repair)");
    let out = v.run(&["fsck", "--repair", v.c()]);
    assert_fails(&out, 7, "repaired all 4 problems");
    assert!(!half.exists());
    let out = v.run(&["fsck", v.c()]);
    assert!(out.status.success(), "{}", stderr(&out));
    v.check_contents();
}

// ---------------------------------------------------------------- export

#[test]
fn export_copies_the_tree_with_metadata() {
    let v = Vol::new();
    // Give a file and a directory distinctive times.
    let notes = v.backing("docs/sub/notes.md");
    Command::new("touch")
        .args(["-h", "-d", "2001-02-03 04:05:06"])
        .arg(&notes)
        .status()
        .unwrap();
    let dest = v.f.tmp.path().join("out");
    let out = v.run(&["export", v.c(), s(&dest)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("exported 26 files"), "{text}");
    assert!(text.contains("1 hard links"), "{text}");
    for (p, d) in &v.files {
        assert_eq!(&std::fs::read(dest.join(p)).unwrap(), d, "{p:?}");
    }
    let m = std::fs::metadata(dest.join("docs/sub/notes.md")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);
    assert_eq!(m.mtime(), std::fs::metadata(&notes).unwrap().mtime());
    assert_eq!(
        std::fs::read_link(dest.join("abs-link")).unwrap(),
        Path::new("/etc/hostname")
    );
    assert!(std::fs::symlink_metadata(dest.join("docs/pipe"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(
        std::fs::metadata(dest.join("hello.txt")).unwrap().ino(),
        std::fs::metadata(dest.join("docs/sub/hello-link"))
            .unwrap()
            .ino()
    );
    assert!(dest.join("empty").is_dir());
    assert_eq!(
        xattr(&dest.join("docs"), "user.dir-note").as_deref(),
        Some(&b"a directory xattr"[..])
    );
    // DEST must be new or empty.
    assert_fails(&v.run(&["export", v.c(), s(&dest)]), 2, "not empty");
}

#[test]
fn export_skips_and_lists_unreadable_entries() {
    let v = Vol::new();
    flip_byte(&v.backing("docs/small-05"), 30);
    let one = v.backing("docs/sub/deeper/one");
    std::fs::rename(&one, one.with_file_name("BBBBBBBBBBBBBBBBBBBBBBBBBBBBBB")).unwrap();
    let dest = v.f.tmp.path().join("out");
    let out = v.run(&["export", v.c(), s(&dest)]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("skipped /docs/small-05: block 0 fails"),
        "{err}"
    );
    assert!(
        err.contains("skipped BBBBBBBBBBBBBBBBBBBBBBBBBBBBBB in /docs/sub/deeper"),
        "{err}"
    );
    assert!(err.contains("2 unreadable entries were skipped"), "{err}");
    assert!(!dest.join("docs/small-05").exists(), "no partial file left");
    assert_eq!(
        std::fs::read(dest.join("docs/small-06")).unwrap(),
        v.files[Path::new("docs/small-06")]
    );
}

// ---------------------------------------------------------------- rekey

fn backing_snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut m = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if meta.is_dir() {
                stack.push(p);
                m.insert(rel, Vec::new());
            } else if meta.is_file() {
                m.insert(rel, std::fs::read(&p).unwrap());
            } else {
                m.insert(rel, Vec::new());
            }
        }
    }
    m
}

#[test]
fn rekey_reencrypts_everything_under_a_new_key() {
    let v = Vol::new();
    let old = v.f.volume();
    let before = backing_snapshot(&v.f.cipher);
    let out = v.run(&["rekey", v.c()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("rekeyed"), "{text}");
    let after = backing_snapshot(&v.f.cipher);
    // Every backing name changed but the directory IDs and the config; every non-empty file's
    // bytes changed.
    for (p, _) in after.iter() {
        let n = p.file_name().unwrap();
        if n == "cloakfs.dirid" || n == "cloakfs.conf" {
            continue;
        }
        assert!(!before.contains_key(p), "backing name kept: {p:?}");
    }
    let old_contents: std::collections::HashSet<&Vec<u8>> =
        before.values().filter(|d| d.len() > 16).collect();
    for (p, d) in &after {
        if d.len() > 16 && !p.ends_with("cloakfs.conf") {
            assert!(!old_contents.contains(d), "bytes kept: {p:?}");
        }
    }
    assert_eq!(before.len(), after.len(), "same number of backing entries");
    // The old key opens nothing; the new one everything.
    assert!(cloakfs_core::tools::walk::plain_paths(&old, &v.f.cipher)
        .unwrap()
        .is_empty());
    let new = v.f.volume();
    assert_ne!(old.master_key().expose(), new.master_key().expose());
    v.check_contents();
    let out = v.run(&["fsck", v.c()]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Hard link kept, modes kept.
    assert_eq!(
        std::fs::metadata(v.backing("hello.txt")).unwrap().ino(),
        std::fs::metadata(v.backing("docs/sub/hello-link"))
            .unwrap()
            .ino()
    );
    assert_eq!(
        std::fs::metadata(v.backing("docs/sub/notes.md"))
            .unwrap()
            .mode()
            & 0o7777,
        0o640
    );
}

#[test]
fn rekey_refuses_journal_other_slots_and_resume_without_journal() {
    let v = Vol::new();
    assert_fails(
        &v.run(&["rekey", "--resume", v.c()]),
        2,
        "no interrupted rekey",
    );
    assert_fails(
        &v.run(&["rekey", "--rollback", v.c()]),
        2,
        "no interrupted rekey",
    );
    // A second slot: refused without --drop-other-slots, dropped with it.
    let vol = v.f.volume();
    let mut cfg = vol.config().clone();
    cfg.add_passphrase_slot(
        vol.master_key(),
        &Passphrase::new(b"second secret".to_vec()),
        cloakfs_core::crypto::kdf::Argon2Params::LEAST,
        "backup",
        cloakfs_core::format::config::SlotRandomness::fresh(),
    )
    .unwrap();
    cfg.seal(vol.master_key());
    cfg.save(&v.f.cipher).unwrap();
    let out = v.run(&["rekey", v.c()]);
    assert_fails(&out, 2, "--drop-other-slots");
    let out = v.run(&["rekey", "--drop-other-slots", v.c()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("removed key slots 2"),
        "{}",
        stderr(&out)
    );
    let second = v.f.write_pass("second secret");
    assert_fails(
        &cloakfs(&["cat", "--passfile", s(&second), v.c(), "hello.txt"]),
        1,
        "wrong passphrase",
    );
    // A journal blocks every other tool, and a new rekey.
    std::fs::write(v.f.cipher.join("cloakfs.rekey"), "{}").unwrap();
    for args in [
        vec!["rekey", v.c()],
        vec!["fsck", v.c()],
        vec!["cat", v.c(), "hello.txt"],
        vec!["export", v.c(), "/nonexistent-dest"],
        vec!["name", v.c(), "hello.txt"],
    ] {
        assert_fails(&v.run(&args), 8, "rekey --resume");
    }
    assert_fails(&v.run(&["rekey", "--resume", v.c()]), 3, "rekey journal");
}

/// Runs `cloakfs rekey ARGS` with the crash hook set to `n`; returns whether it aborted.
fn rekey_crashing(v: &Vol, extra: &[&str], n: u64) -> bool {
    let out = v
        .bin()
        .args([&["rekey", "--passfile", v.p()], extra, &[v.c()]].concat())
        .env("CLOAKFS_REKEY_CRASH_AFTER", n.to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    if out.status.success() {
        return false;
    }
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "expected an abort: {}",
        stderr(&out)
    );
    true
}

fn steps_of(out: &Output) -> u64 {
    let text = String::from_utf8_lossy(&out.stdout);
    let i = text.find(" atomic steps").expect("step count printed");
    text[..i]
        .rsplit(['(', ' '])
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Copies the cipher directory of `v` to a fresh fixture (same passphrase). A clone has the
/// volume ID of the original, so it gets a machine of its own (a copy of the record of known
/// volumes): a rekey of one clone must not make the others look replaced.
fn clone_vol(v: &Vol) -> Vol {
    let mut f = Fixture::bare();
    let st = Command::new("cp")
        .args(["-a", v.c(), s(&f.cipher)])
        .status()
        .unwrap();
    assert!(st.success());
    f.state = f.tmp.path().join("known-volumes");
    std::fs::create_dir(&f.state).unwrap();
    let record = v.f.state.join("known_volumes.json");
    std::fs::copy(&record, f.state.join("known_volumes.json")).unwrap();
    Vol {
        f,
        files: v.files.clone(),
    }
}

#[test]
fn rekey_killed_at_any_step_resumes_or_rolls_back_without_loss() {
    let template = Vol::new();
    // How many atomic steps does a whole rekey take?
    let probe = clone_vol(&template);
    let out = probe.run(&["rekey", probe.c()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let total = steps_of(&out);
    assert!(total > 40, "{total} steps");
    let points = [
        1,
        2,
        total / 5,
        total / 3,
        total / 2,
        2 * total / 3,
        total - 5,
        total - 1,
        total,
    ];
    for (i, &n) in points.iter().enumerate() {
        let v = clone_vol(&template);
        let hashes_before = backing_snapshot(&v.f.cipher);
        assert!(
            rekey_crashing(&v, &[], n),
            "no crash at step {n} of {total}"
        );
        assert!(v.f.cipher.join("cloakfs.rekey").exists());
        // While interrupted, the volume is refused by the tools (and by mount).
        assert_fails(&v.run(&["cat", v.c(), "hello.txt"]), 8, "interrupted");
        if n < total && i % 2 == 0 {
            let out = v.run(&["rekey", "--rollback", v.c()]);
            assert!(out.status.success(), "rollback after {n}: {}", stderr(&out));
            // The old key opens everything again.
            v.check_contents();
            let after = backing_snapshot(&v.f.cipher);
            assert_eq!(
                after.keys().collect::<Vec<_>>(),
                hashes_before.keys().collect::<Vec<_>>(),
                "names restored after {n}"
            );
        } else {
            // A second crash during the resume, then a full resume.
            if n > 3 && n + 2 < total {
                assert!(rekey_crashing(&v, &["--resume"], 2), "no crash in resume");
            }
            let out = v.run(&["rekey", "--resume", v.c()]);
            assert!(out.status.success(), "resume after {n}: {}", stderr(&out));
            v.check_contents();
            if n < total {
                let after = backing_snapshot(&v.f.cipher);
                assert!(
                    after.keys().all(|k| !hashes_before.contains_key(k)
                        || k.ends_with("cloakfs.dirid")
                        || k.ends_with("cloakfs.conf")),
                    "every name converted after resume from {n}"
                );
            }
        }
        assert!(!v.f.cipher.join("cloakfs.rekey").exists());
        let out = v.run(&["fsck", v.c()]);
        assert!(
            out.status.success(),
            "fsck after {n}: {}{}",
            stderr(&out),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // Crashed right after the config swap: nothing left to roll back.
    let v = clone_vol(&template);
    assert!(rekey_crashing(&v, &[], total));
    assert_fails(
        &v.run(&["rekey", "--rollback", v.c()]),
        5,
        "already completed",
    );
    assert!(!v.f.cipher.join("cloakfs.rekey").exists());
    v.check_contents();
}

#[test]
fn rekey_stops_cleanly_on_sigint_and_resumes() {
    let v = Vol::new();
    let w_vol = v.f.volume();
    let w = Writer::new(&w_vol, &v.f.cipher);
    // Enough entries that the signal lands in the middle.
    for i in 0..300 {
        w.write_file(Path::new(&format!("docs/sub/n{i:03}")), &[i as u8; 9000])
            .unwrap();
    }
    drop(w_vol);
    for delay_ms in [150u64, 400] {
        let child = bin()
            .args(["rekey", "--passfile", v.p(), v.c()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        // SIGINT, as a Ctrl-C would send.
        // SAFETY: kill(2) on the PID of our own child, which has not been reaped yet.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        let out = child.wait_with_output().unwrap();
        let journal = v.f.cipher.join("cloakfs.rekey").exists();
        match out.status.code() {
            Some(0) => assert!(!journal, "finished before the signal"),
            Some(130) => {
                assert!(journal);
                assert!(stderr(&out).contains("--resume"), "{}", stderr(&out));
            }
            // Killed by the signal before the handler was installed.
            None => {}
            other => panic!("rekey exit {other:?}: {}", stderr(&out)),
        }
        if journal {
            let out = v.run(&["rekey", "--resume", v.c()]);
            assert!(out.status.success(), "{}", stderr(&out));
        }
        let out = v.run(&["cat", v.c(), "docs/sub/n123"]);
        assert_eq!(out.stdout, vec![123u8; 9000], "{}", stderr(&out));
        v.check_contents();
    }
}

#[test]
fn rekey_stops_at_a_damaged_file_and_rolls_back() {
    let v = Vol::new();
    let damaged = v.backing("docs/small-09");
    flip_byte(&damaged, 18 + 5);
    let before = std::fs::read(&damaged).unwrap();
    let out = v.run(&["rekey", v.c()]);
    assert_fails(&out, 6, "block 0");
    assert!(stderr(&out).contains("--rollback"), "{}", stderr(&out));
    assert!(v.f.cipher.join("cloakfs.rekey").exists());
    let out = v.run(&["rekey", "--rollback", v.c()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("left as it was"),
        "the damaged file is reported: {}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read(&damaged).unwrap(),
        before,
        "damaged file untouched"
    );
    // Everything else reads as before; fsck reports just the damaged block.
    let out = v.run(&["fsck", "--json", v.c()]);
    assert_eq!(kinds(&json(&out)), vec!["block"]);
    let mut files = v.files.clone();
    files.remove(Path::new("docs/small-09"));
    for (p, d) in &files {
        let out = v.run(&["cat", v.c(), s(p)]);
        assert_eq!(&out.stdout, d, "{p:?}: {}", stderr(&out));
    }
}

#[test]
fn rekey_and_repair_refuse_a_mounted_volume() {
    let v = Vol::new();
    let out = v.f.mount(&[]);
    if !out.status.success() {
        eprintln!("skipped: cannot mount here: {}", stderr(&out));
        return;
    }
    let guard = MountGuard(v.f.mnt.clone());
    assert_fails(&v.run(&["rekey", v.c()]), 8, "is mounted on");
    assert_fails(&v.run(&["fsck", "--repair", v.c()]), 8, "is mounted on");
    let out = v.run(&["fsck", v.c()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("is mounted on"), "{}", stderr(&out));
    guard.unmount();
    let out = v.run(&["rekey", v.c()]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The rekeyed volume mounts and reads back.
    let guard = v.f.mounted(&[]);
    assert_eq!(
        std::fs::read(v.f.mnt.join("docs/big.bin")).unwrap(),
        v.files[Path::new("docs/big.bin")]
    );
    assert_eq!(
        std::fs::read(v.f.mnt.join(format!("docs/{}", long_name()))).unwrap(),
        b"long named\n"
    );
    guard.unmount();
}
