//! Sharing single files with public keys (issue 24), end to end: real keys from Debian's
//! `age-keygen` and `ssh-keygen`, real FUSE mounts of one cipher directory by several members
//! at once, the `age` binary opening an export, and each bad input failing with one line.

mod common;

use common::gpg::GnuPgHome;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}{}",
        stderr(out),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An age identity made by `age-keygen`; returns its path and public key.
fn age_key(dir: &Path, name: &str) -> (PathBuf, String) {
    let p = dir.join(name);
    let out = Command::new("age-keygen")
        .arg("-o")
        .arg(&p)
        .output()
        .unwrap();
    assert!(out.status.success(), "age-keygen: {}", stderr(&out));
    let public = Command::new("age-keygen")
        .arg("-y")
        .arg(&p)
        .output()
        .unwrap();
    (
        p,
        String::from_utf8(public.stdout).unwrap().trim().to_string(),
    )
}

/// An unencrypted ssh-ed25519 key made by `ssh-keygen`; returns its path and public key.
fn ssh_key(dir: &Path, name: &str) -> (PathBuf, String) {
    let p = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(out.status.success(), "ssh-keygen: {}", stderr(&out));
    let public = std::fs::read_to_string(p.with_extension("pub"))
        .or_else(|_| std::fs::read_to_string(format!("{}.pub", p.display())))
        .unwrap();
    (p, public.trim().to_string())
}

struct Team {
    f: Fixture,
    alice: (PathBuf, String),
    bob: (PathBuf, String),
    carol: (PathBuf, String),
}

/// A sharing volume with three members: alice and bob (age keys), carol (an ssh key).
fn team() -> Team {
    let f = Fixture::bare();
    ok(&f.init(&["--sharing"]));
    let dir = f.tmp.path().to_path_buf();
    let team = Team {
        alice: age_key(&dir, "alice.key"),
        bob: age_key(&dir, "bob.key"),
        carol: ssh_key(&dir, "carol_ed25519"),
        f,
    };
    team.add_member_slots();
    team
}

impl Team {
    /// `cloakfs share remove --volume` of `path` from `recipient`, run with `who`'s identity.
    fn remove_offline(&self, who: &(PathBuf, String), path: &str, recipient: &str) -> Output {
        self.f.run(&[
            "share",
            "remove",
            "--volume",
            s(&self.f.cipher),
            "--identity",
            s(&who.0),
            path,
            "--recipient",
            recipient,
        ])
    }

    /// A recipient slot for each of the three (carol by her ssh public key file).
    fn add_member_slots(&self) {
        for (who, label) in [
            (&self.alice, "alice"),
            (&self.bob, "bob"),
            (&self.carol, "carol"),
        ] {
            let recipient = if label == "carol" {
                format!("{}.pub", who.0.display())
            } else {
                who.1.clone()
            };
            ok(&self.f.run(&[
                "slots",
                "add",
                s(&self.f.cipher),
                "--passfile",
                s(&self.f.pass),
                "--recipient",
                &recipient,
                "--label",
                label,
            ]));
        }
    }

    fn mount(&self, who: &(PathBuf, String), name: &str) -> MountGuard {
        let mnt = self.f.tmp.path().join(name);
        std::fs::create_dir_all(&mnt).unwrap();
        ok(&self
            .f
            .run(&["mount", "--identity", s(&who.0), s(&self.f.cipher), s(&mnt)]));
        assert!(is_mounted(&mnt));
        MountGuard(mnt)
    }

    /// `who`'s mount at `name`, on the machine whose record of known volumes is `state`, and
    /// what it printed.
    fn mount_on(&self, state: &Path, who: &(PathBuf, String), name: &str) -> (MountGuard, String) {
        let mnt = self.f.tmp.path().join(name);
        std::fs::create_dir_all(&mnt).unwrap();
        let out = self
            .f
            .bin()
            .env("CLOAKFS_STATE_DIR", state)
            .args(["mount", "--identity", s(&who.0), s(&self.f.cipher), s(&mnt)])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        (MountGuard(mnt), stderr(&out))
    }

    fn cat(&self, who: &(PathBuf, String), path: &str) -> Output {
        self.f
            .run(&["cat", s(&self.f.cipher), path, "--identity", s(&who.0)])
    }
}

fn denied(p: &Path) -> bool {
    std::fs::read(p).is_err_and(|e| e.raw_os_error() == Some(libc::EACCES))
}

#[test]
fn three_members_grant_read_list_export_and_revoke() {
    let t = team();
    let ma = t.mount(&t.alice, "alice");
    let mb = t.mount(&t.bob, "bob");
    let mc = t.mount(&t.carol, "carol");
    std::fs::write(ma.0.join("plan.txt"), "plan\n").unwrap();

    // Bob and carol see the name and the size, and get EACCES on open, never EIO or garbage.
    for m in [&mb, &mc] {
        let meta = std::fs::metadata(m.0.join("plan.txt")).unwrap();
        assert_eq!(meta.len(), 5);
        assert!(denied(&m.0.join("plan.txt")));
        let w = std::fs::OpenOptions::new()
            .write(true)
            .open(m.0.join("plan.txt"));
        assert_eq!(w.unwrap_err().raw_os_error(), Some(libc::EACCES));
    }

    // Granted through alice's mount: bob reads it in his.
    let plan = ma.0.join("plan.txt");
    ok(&cloakfs(&[
        "share",
        "add",
        s(&plan),
        "--recipient",
        &t.bob.1,
    ]));
    assert_eq!(
        std::fs::read_to_string(mb.0.join("plan.txt")).unwrap(),
        "plan\n"
    );
    assert!(denied(&mc.0.join("plan.txt")));
    // Carol by her ssh public key file.
    ok(&cloakfs(&[
        "share",
        "add",
        s(&plan),
        "--recipient",
        &format!("{}.pub", t.carol.0.display()),
    ]));
    assert_eq!(
        std::fs::read_to_string(mc.0.join("plan.txt")).unwrap(),
        "plan\n"
    );

    // The list, from any recipient's mount, in both forms.
    let listed = ok(&cloakfs(&["share", "list", s(&mb.0.join("plan.txt"))]));
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(
        lines,
        [t.alice.1.as_str(), t.bob.1.as_str(), t.carol.1.as_str()]
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&cloakfs(&["share", "list", s(&plan), "--json"]))).unwrap();
    assert_eq!(json["recipients"].as_array().unwrap().len(), 3);
    assert_eq!(json["verified"], true);

    // Writes by a recipient keep the grants (O_TRUNC included). (Alice's mount may still
    // serve its own page cache: two mounts of one directory are not coherent; read offline.)
    std::fs::write(mb.0.join("plan.txt"), "plan v2\n").unwrap();
    assert_eq!(ok(&t.cat(&t.alice, "plan.txt")), "plan v2\n");
    assert_eq!(ok(&t.cat(&t.carol, "plan.txt")), "plan v2\n");

    // An outsider gets a standard age file that the `age` binary opens.
    let (dave, dave_pub) = age_key(t.f.tmp.path(), "dave.key");
    let exported = t.f.tmp.path().join("plan.txt.age");
    ok(&cloakfs(&[
        "share",
        "export",
        s(&mb.0.join("plan.txt")),
        "--recipient",
        &dave_pub,
        "-o",
        s(&exported),
    ]));
    let out = Command::new("age")
        .args(["-d", "-i"])
        .arg(&dave)
        .arg(&exported)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "plan v2\n",
        "{}",
        stderr(&out)
    );

    for m in [ma, mb, mc] {
        m.unmount();
    }

    // Offline: bob reads it without a mount, then loses it; alice and carol keep it.
    assert_eq!(ok(&t.cat(&t.bob, "plan.txt")), "plan v2\n");
    let backing_before = only_file(&t.f.cipher);
    let old_header = std::fs::read(&backing_before).unwrap()[..4096].to_vec();
    ok(&t.remove_offline(&t.alice, "plan.txt", &t.bob.1));
    assert_fails(
        &t.cat(&t.bob, "plan.txt"),
        6,
        "not shared with this identity",
    );
    assert_eq!(ok(&t.cat(&t.alice, "plan.txt")), "plan v2\n");
    assert_eq!(ok(&t.cat(&t.carol, "plan.txt")), "plan v2\n");
    // A fresh file ID (and key): bob's remembered header opens nothing written afterwards.
    let new_header = std::fs::read(only_file(&t.f.cipher)).unwrap()[..4096].to_vec();
    assert_ne!(old_header[2..18], new_header[2..18]);

    // A backing file copied out of the volume opens with a recipient's key alone.
    let copy = t.f.tmp.path().join("copied");
    std::fs::copy(only_file(&t.f.cipher), &copy).unwrap();
    let out = t.f.run(&[
        "cat",
        "--raw",
        "--volume",
        s(&t.f.cipher),
        "--identity",
        s(&t.carol.0),
        s(&copy),
    ]);
    assert_eq!(ok(&out), "plan v2\n");
}

#[test]
fn withdrawal_through_a_mount_shuts_the_member_out_at_once() {
    let t = team();
    let ma = t.mount(&t.alice, "alice");
    let mb = t.mount(&t.bob, "bob");
    let mc = t.mount(&t.carol, "carol");
    let plan = ma.0.join("plan.txt");
    std::fs::write(&plan, "plan\n").unwrap();
    for key in [t.bob.1.clone(), format!("{}.pub", t.carol.0.display())] {
        ok(&cloakfs(&["share", "add", s(&plan), "--recipient", &key]));
    }
    // Bob has read it (his kernel caches its pages) and still holds it open in his mount.
    assert_eq!(
        std::fs::read_to_string(mb.0.join("plan.txt")).unwrap(),
        "plan\n"
    );
    let held = std::fs::File::open(mb.0.join("plan.txt")).unwrap();
    assert_eq!(
        std::fs::read_to_string(mc.0.join("plan.txt")).unwrap(),
        "plan\n"
    );
    // What its users see stays: an extended attribute, the mode and the times.
    rustix::fs::setxattr(&plan, "user.note", b"keep", rustix::fs::XattrFlags::empty()).unwrap();
    let before = std::fs::metadata(&plan).unwrap();
    // Its backing name stays; the file behind it is replaced.
    let backing = only_file(&t.f.cipher);
    let old_id = std::fs::read(&backing).unwrap()[2..18].to_vec();

    // Each refusal, in one line, leaving the file as it was.
    let (_, stranger) = age_key(t.f.tmp.path(), "stranger.key");
    assert_fails(
        &cloakfs(&["share", "remove", s(&plan), "--recipient", &stranger]),
        2,
        "not a recipient of this file",
    );
    let both = format!("{}\n{}", t.bob.1, t.alice.1);
    assert_fails(
        &cloakfs(&["share", "remove", s(&plan), "--recipient", &both]),
        2,
        "give one recipient to remove",
    );
    let solo = ma.0.join("solo.txt");
    std::fs::write(&solo, "solo\n").unwrap();
    assert_fails(
        &cloakfs(&["share", "remove", s(&solo), "--recipient", &t.alice.1]),
        2,
        "only recipient",
    );
    let second_name = ma.0.join("plan-link.txt");
    std::fs::hard_link(&plan, &second_name).unwrap();
    assert_fails(
        &cloakfs(&["share", "remove", s(&plan), "--recipient", &t.bob.1]),
        2,
        "several names (hard links)",
    );
    std::fs::remove_file(&second_name).unwrap();
    let open_here = std::fs::File::open(&plan).unwrap();
    assert_fails(
        &cloakfs(&["share", "remove", s(&plan), "--recipient", &t.bob.1]),
        5,
        "the file is open in its mount",
    );
    drop(open_here);
    assert_eq!(std::fs::read(&backing).unwrap()[2..18], old_id[..]);

    // The form the issue names: done by alice's running mount.
    let out = ok(&cloakfs(&[
        "share",
        "remove",
        s(&plan),
        "--recipient",
        &t.bob.1,
    ]));
    assert!(out.contains("fresh file key"), "{out}");

    // Bob: Permission denied on a new open, although his kernel had the pages and a handle
    // still has the old file open (what was read before cannot be taken back).
    assert!(denied(&mb.0.join("plan.txt")));
    assert!(denied(&mb.0.join("plan.txt")));
    assert_fails(
        &cloakfs(&["share", "list", s(&mb.0.join("plan.txt"))]),
        5,
        "not shared with the identity this mount runs as",
    );
    drop(held);
    assert!(denied(&mb.0.join("plan.txt")));
    // The others read it, in their mounts, as before; the listing has two entries.
    assert_eq!(std::fs::read_to_string(&plan).unwrap(), "plan\n");
    assert_eq!(
        std::fs::read_to_string(mc.0.join("plan.txt")).unwrap(),
        "plan\n"
    );
    let listed = ok(&cloakfs(&["share", "list", s(&plan)]));
    assert_eq!(
        listed.lines().collect::<Vec<_>>(),
        [t.alice.1.as_str(), t.carol.1.as_str()]
    );
    let after = std::fs::metadata(&plan).unwrap();
    assert_eq!(
        (after.modified().unwrap(), after.mode(), after.len()),
        (before.modified().unwrap(), before.mode(), before.len())
    );
    let mut note = [0u8; 16];
    let n = rustix::fs::getxattr(&plan, "user.note", &mut note).unwrap();
    assert_eq!(&note[..n], b"keep");
    // A fresh file ID and key; what alice writes next reaches carol and not bob.
    assert_ne!(std::fs::read(&backing).unwrap()[2..18], old_id[..]);
    std::fs::write(&plan, "plan v2\n").unwrap();
    assert_eq!(
        std::fs::read_to_string(mc.0.join("plan.txt")).unwrap(),
        "plan v2\n"
    );
    assert!(denied(&mb.0.join("plan.txt")));
    assert_fails(
        &t.cat(&t.bob, "plan.txt"),
        6,
        "not shared with this identity",
    );
    for m in [ma, mb, mc] {
        m.unmount();
    }
}

/// The one regular file in the root of a cipher directory.
fn only_file(cipher: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(cipher)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            !p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("cloakfs.")
        })
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

#[test]
fn removal_killed_midway_leaves_the_old_file_readable() {
    let t = team();
    let ma = t.mount(&t.alice, "alice");
    // Large enough that the re-encryption is still running when it is caught.
    let data: Vec<u8> = (0..48u32 << 20).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(ma.0.join("big"), &data).unwrap();
    ok(&cloakfs(&[
        "share",
        "add",
        s(&ma.0.join("big")),
        "--recipient",
        &t.bob.1,
    ]));
    ma.unmount();

    let mut child =
        t.f.bin()
            .args([
                "share",
                "remove",
                "--volume",
                s(&t.f.cipher),
                "--identity",
                s(&t.alice.0),
                "big",
                "--recipient",
                &t.bob.1,
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
    // Caught once its temporary copy exists (or, on a fast machine, after it finished).
    let killed_midway = loop {
        let tmp = std::fs::read_dir(&t.f.cipher).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("cloakfs.share.tmp.")
        });
        if tmp {
            child.kill().unwrap();
            break true;
        }
        if child.try_wait().unwrap().is_some() {
            break false;
        }
        std::thread::yield_now();
    };
    child.wait().unwrap();
    // Either the old file (bob still reads it) or the new one (he does not): never a mix.
    let alice = t.cat(&t.alice, "big");
    assert!(alice.status.success(), "{}", stderr(&alice));
    assert!(alice.stdout == data, "alice reads the whole file");
    let bob = t.cat(&t.bob, "big");
    if bob.status.success() {
        assert!(bob.stdout == data);
    } else {
        assert!(stderr(&bob).contains("not shared with this identity"));
    }
    eprintln!("killed midway: {killed_midway}");
    // The mount ignores a leftover temporary (an internal name).
    let ma = t.mount(&t.alice, "alice");
    let names: Vec<String> = std::fs::read_dir(&ma.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["big"]);
    ma.unmount();
}

#[test]
fn bad_input_fails_with_one_clear_line() {
    let t = team();
    // A sharing volume needs a member identity to mount.
    let out = t.f.run(&[
        "mount",
        "--passfile",
        s(&t.f.pass),
        s(&t.f.cipher),
        s(&t.f.mnt),
    ]);
    assert_fails(&out, 2, "sharing volume: mount it with --identity");

    let ma = t.mount(&t.alice, "alice");
    let plan = ma.0.join("plan.txt");
    std::fs::write(&plan, "plan\n").unwrap();
    // A malformed key.
    assert_fails(
        &cloakfs(&["share", "add", s(&plan), "--recipient", "age1notakey"]),
        2,
        "not a valid age X25519 key",
    );
    assert_fails(
        &cloakfs(&["share", "add", s(&plan), "--recipient", "hello"]),
        2,
        "not an age (age1...) or ssh",
    );
    // A path outside any cloakfs mount.
    assert_fails(
        &cloakfs(&["share", "add", s(&t.f.pass), "--recipient", &t.bob.1]),
        2,
        "is not inside a cloakfs mount",
    );
    assert_fails(
        &cloakfs(&["share", "list", "/no/such/path"]),
        2,
        "/no/such/path",
    );
    // A member without an entry cannot grant.
    let mb = t.mount(&t.bob, "bob");
    assert_fails(
        &cloakfs(&[
            "share",
            "add",
            s(&mb.0.join("plan.txt")),
            "--recipient",
            &t.bob.1,
        ]),
        5,
        "not shared with the identity this mount runs as",
    );
    mb.unmount();
    ma.unmount();

    let offline = |args: &[&str]| {
        t.f.run(
            &[
                &["share"][..],
                &args[..1],
                &["--volume", s(&t.f.cipher), "--identity", s(&t.alice.0)],
                &args[1..],
            ]
            .concat(),
        )
    };
    // An unknown key: not a recipient of the file.
    let (_, stranger) = age_key(t.f.tmp.path(), "stranger.key");
    assert_fails(
        &offline(&["remove", "plan.txt", "--recipient", &stranger]),
        2,
        "not a recipient of this file",
    );
    assert_fails(
        &offline(&["remove", "plan.txt", "--recipient", &t.alice.1]),
        2,
        "only recipient",
    );
    assert_fails(&offline(&["list", "nothing-here"]), 5, "no such file");

    // Rekey keeps the members' slots only when told to drop them (they need their own
    // secrets), and a sharing volume without a stored key is refused (members are key slots).
    assert_fails(
        &t.f.run(&["rekey", s(&t.f.cipher), "--passfile", s(&t.f.pass)]),
        2,
        "--drop-other-slots",
    );
    let other = Fixture::bare();
    let out = other.init(&["--sharing", "--no-stored-key"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot be used with"),
        "{}",
        stderr(&out)
    );

    // A volume that is not a sharing one.
    let plain = Fixture::new();
    let out = plain.run(&[
        "share",
        "list",
        "--volume",
        s(&plain.cipher),
        "--passfile",
        s(&plain.pass),
        "x",
    ]);
    assert_fails(&out, 3, "not a sharing volume");
    let pm = plain.mounted(&[]);
    std::fs::write(pm.0.join("x"), "x").unwrap();
    assert_fails(
        &cloakfs(&["share", "list", s(&pm.0.join("x"))]),
        3,
        "not a sharing volume",
    );
    pm.unmount();
}

#[test]
fn new_files_inherit_a_directory_s_default_recipients() {
    let t = team();
    let ma = t.mount(&t.alice, "alice");
    let mb = t.mount(&t.bob, "bob");
    let reports = ma.0.join("reports");
    std::fs::create_dir(&reports).unwrap();
    ok(&cloakfs(&[
        "share",
        "default",
        s(&reports),
        "--recipient",
        &t.bob.1,
    ]));
    assert_eq!(
        ok(&cloakfs(&["share", "default", s(&reports)])).trim(),
        t.bob.1
    );
    // The setting is not an xattr anyone sees.
    assert!(xattr_names(&reports).iter().all(|n| !n.contains("cloakfs")));
    std::fs::write(reports.join("q3.txt"), "q3\n").unwrap();
    // A directory made below inherits, and files in it too.
    std::fs::create_dir(reports.join("2026")).unwrap();
    std::fs::write(reports.join("2026/q4.txt"), "q4\n").unwrap();
    std::fs::write(ma.0.join("private.txt"), "mine\n").unwrap();
    assert_eq!(
        std::fs::read_to_string(mb.0.join("reports/q3.txt")).unwrap(),
        "q3\n"
    );
    assert_eq!(
        std::fs::read_to_string(mb.0.join("reports/2026/q4.txt")).unwrap(),
        "q4\n"
    );
    assert!(denied(&mb.0.join("private.txt")));
    // Cleared: new files are the creator's alone again.
    ok(&cloakfs(&["share", "default", s(&reports), "--clear"]));
    std::fs::write(reports.join("q5.txt"), "q5\n").unwrap();
    assert!(denied(&mb.0.join("reports/q5.txt")));
    mb.unmount();
    ma.unmount();

    // Offline, the same setting on a cipher directory.
    let offline = |args: &[&str]| {
        t.f.run(
            &[
                &["share", "default", "--volume", s(&t.f.cipher)][..],
                &["--identity", s(&t.alice.0)],
                args,
            ]
            .concat(),
        )
    };
    ok(&offline(&["reports", "--recipient", &t.carol.1]));
    assert_eq!(ok(&offline(&["reports"])).trim(), t.carol.1);
    assert_fails(
        &offline(&["private.txt", "--recipient", &t.carol.1]),
        2,
        "not a directory",
    );

    // fsck as bob: the files not shared with him are counted, not reported as damage.
    let out =
        t.f.run(&["fsck", s(&t.f.cipher), "--identity", s(&t.bob.0)]);
    let text = ok(&out);
    assert!(text.contains("no problems"), "{text}");
    assert!(
        text.contains("2 files are not shared with the identity given"),
        "{text}"
    );
}

fn xattr_names(p: &Path) -> Vec<String> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::listxattr(p, &mut buf).unwrap();
    buf[..n]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

/// fsck on a sharing volume: files no member can open and entries for keys no slot holds are
/// listed (the slots keep their public keys), and a broken list is a problem.
#[test]
fn fsck_reports_who_can_open_what_and_broken_lists() {
    let t = team();
    let dir = t.f.tmp.path().to_path_buf();
    let dave = age_key(&dir, "dave.key"); // outside the volume: no slot
    let ma = t.mount(&t.alice, "alice");
    std::fs::write(ma.0.join("plan.txt"), "plan\n").unwrap();
    std::fs::write(ma.0.join("solo.txt"), "solo\n").unwrap();
    for f in ["plan.txt", "solo.txt"] {
        ok(&cloakfs(&[
            "share",
            "add",
            s(&ma.0.join(f)),
            "--recipient",
            &dave.1,
        ]));
    }
    ma.unmount();
    // solo.txt ends up shared with dave alone.
    ok(&t.remove_offline(&t.alice, "solo.txt", &t.alice.1));

    let fsck = |extra: &[&str]| {
        t.f.run(
            &[
                &["fsck", s(&t.f.cipher), "--identity", s(&t.alice.0)],
                extra,
            ]
            .concat(),
        )
    };
    let out = fsck(&["--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sh = &r["sharing"];
    assert_eq!(sh["member_keys"].as_array().unwrap().len(), 3, "{sh}");
    assert_eq!(sh["no_member_can_open"], serde_json::json!(["/solo.txt"]));
    let unknown = sh["unknown_keys"].as_array().unwrap();
    assert_eq!(unknown.len(), 2, "{sh}");
    assert!(unknown.iter().all(|e| e[1] == dave.1.as_str()), "{sh}");
    let text = String::from_utf8(fsck(&[]).stdout).unwrap();
    assert!(
        text.contains("/solo.txt: no member of the volume can open it"),
        "{text}"
    );
    assert!(
        text.contains(&format!("/plan.txt: shared with {}", dave.1)),
        "{text}"
    );

    // One character of dave's entry in plan.txt changed: the list no longer authenticates.
    let plan = std::fs::read_dir(&t.f.cipher)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let b = std::fs::read(p).unwrap_or_default();
            !p.is_dir()
                && b.windows(dave.1.len()).any(|w| w == dave.1.as_bytes())
                && b.windows(t.alice.1.len())
                    .any(|w| w == t.alice.1.as_bytes())
        })
        .expect("plan.txt's backing file");
    let mut b = std::fs::read(&plan).unwrap();
    let at = b
        .windows(dave.1.len())
        .position(|w| w == dave.1.as_bytes())
        .unwrap();
    let last = at + dave.1.len() - 1;
    b[last] = if b[last] == b'q' { b'p' } else { b'q' };
    std::fs::write(&plan, &b).unwrap();
    let out = fsck(&[]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("/plan.txt"), "{text}");
}

/// rekey of a sharing volume moves names and metadata to the new master key and leaves each
/// file's own key (and so who can open it) as it was.
#[test]
fn rekey_keeps_every_file_s_recipients() {
    let t = team();
    let ma = t.mount(&t.alice, "alice");
    std::fs::create_dir(ma.0.join("docs")).unwrap();
    std::fs::write(ma.0.join("docs/plan.txt"), "plan\n").unwrap();
    ok(&cloakfs(&[
        "share",
        "add",
        s(&ma.0.join("docs/plan.txt")),
        "--recipient",
        &t.bob.1,
    ]));
    std::fs::write(ma.0.join("old.txt"), "old\n").unwrap();
    ok(&cloakfs(&[
        "share",
        "add",
        s(&ma.0.join("old.txt")),
        "--recipient",
        &t.bob.1,
    ]));
    ma.unmount();
    // A withdrawal before the rekey, and a copy of the file from before it: the record of the
    // retired ID moves to the new key with everything else.
    let old_backing = std::fs::read_dir(&t.f.cipher)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.is_file()
                && !p
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("cloakfs.")
        })
        .unwrap();
    let old_copy = std::fs::read(&old_backing).unwrap();
    ok(&t.remove_offline(&t.alice, "old.txt", &t.bob.1));
    let record = || {
        let dir = t.f.cipher.join("cloakfs.retired");
        let e = std::fs::read_dir(dir).unwrap().next().unwrap().unwrap();
        std::fs::read(e.path()).unwrap()
    };
    let record_before = record();
    let names = || -> Vec<String> {
        std::fs::read_dir(&t.f.cipher)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    let before = names();
    // Only the passphrase slot can be re-wrapped; the members are added again afterwards.
    ok(&t.f.run(&[
        "rekey",
        "--passfile",
        s(&t.f.pass),
        "--drop-other-slots",
        s(&t.f.cipher),
    ]));
    let after = names();
    let renamed = (before.iter()).filter(|n| !n.starts_with("cloakfs.") && !after.contains(n));
    assert!(
        renamed.count() > 0,
        "names were not re-encrypted: {before:?} {after:?}"
    );
    t.add_member_slots();
    assert_eq!(ok(&t.cat(&t.alice, "docs/plan.txt")), "plan\n");
    assert_eq!(ok(&t.cat(&t.bob, "docs/plan.txt")), "plan\n");
    assert!(!t.cat(&t.carol, "docs/plan.txt").status.success());
    let out =
        t.f.run(&["fsck", s(&t.f.cipher), "--identity", s(&t.alice.0)]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::remove_file(&old_backing).ok();
    let name = [
        "name",
        "--passfile",
        s(&t.f.pass),
        s(&t.f.cipher),
        "old.txt",
    ];
    let new_backing = PathBuf::from(ok(&t.f.run(&name)).trim());
    std::fs::write(&new_backing, &old_copy).unwrap();
    let fresh = t.f.tmp.path().join("no-local-record");
    let out = cat_on(&t, &fresh, &t.alice, "old.txt");
    assert!(
        stderr(&out).contains("authentication failed"),
        "{}",
        stderr(&out)
    );
    // The retirement record was re-made under the new key.
    assert_ne!(record(), record_before);
}

/// Runs `cloakfs ARGS` of fixture `f` with `GNUPGHOME` = `home`.
fn with_gpg(f: &Fixture, home: &GnuPgHome, args: &[&str]) -> Output {
    f.bin()
        .env("GNUPGHOME", home.path())
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn an_age_member_shares_with_a_gpg_key_read_offline_and_through_a_mount() {
    let dave = GnuPgHome::new(&["Dave <dave@example.org>"]);
    let t = team();
    let f = &t.f;
    let fpr = dave.fingerprint();
    // Dave is a member through a gpg key slot.
    ok(&with_gpg(
        f,
        &dave,
        &[
            "slots",
            "add",
            s(&f.cipher),
            "--passfile",
            s(&f.pass),
            "--gpg-recipient",
            "dave@example.org",
        ],
    ));
    // Alice's mount seals to dave's key with the gpg of her environment.
    let amnt = f.tmp.path().join("alice");
    std::fs::create_dir_all(&amnt).unwrap();
    ok(&with_gpg(
        f,
        &dave,
        &["mount", "--identity", s(&t.alice.0), s(&f.cipher), s(&amnt)],
    ));
    let ma = MountGuard(amnt);
    let plan = ma.0.join("plan.txt");
    std::fs::write(&plan, "plan\n").unwrap();
    std::fs::write(ma.0.join("private.txt"), "mine\n").unwrap();
    ok(&with_gpg(
        f,
        &dave,
        &[
            "share",
            "add",
            s(&plan),
            "--gpg-recipient",
            "dave@example.org",
        ],
    ));
    let listed = ok(&cloakfs(&["share", "list", s(&plan)]));
    assert_eq!(
        listed.lines().collect::<Vec<_>>(),
        [t.alice.1.clone(), format!("gpg:{fpr}")]
    );
    // A directory whose new files go to dave as well.
    let reports = ma.0.join("reports");
    std::fs::create_dir(&reports).unwrap();
    ok(&with_gpg(
        f,
        &dave,
        &[
            "share",
            "default",
            s(&reports),
            "--gpg-recipient",
            "dave@example.org",
        ],
    ));
    assert_eq!(
        ok(&cloakfs(&["share", "default", s(&reports)])).trim(),
        format!("gpg:{fpr}")
    );
    std::fs::write(reports.join("q3.txt"), "q3\n").unwrap();

    // Dave reads offline with --gpg alone, and not what was not shared with him.
    let cat = |path: &str| with_gpg(f, &dave, &["cat", s(&f.cipher), path, "--gpg"]);
    assert_eq!(ok(&cat("plan.txt")), "plan\n");
    assert_eq!(ok(&cat("reports/q3.txt")), "q3\n");
    assert_fails(&cat("private.txt"), 6, "permission denied");

    // And through a mount unlocked by his gpg key slot.
    let dmnt = f.tmp.path().join("dave");
    std::fs::create_dir_all(&dmnt).unwrap();
    ok(&with_gpg(
        f,
        &dave,
        &["mount", "--gpg", s(&f.cipher), s(&dmnt)],
    ));
    let md = MountGuard(dmnt);
    assert_eq!(
        std::fs::read_to_string(md.0.join("plan.txt")).unwrap(),
        "plan\n"
    );
    assert_eq!(
        std::fs::read_to_string(md.0.join("reports/q3.txt")).unwrap(),
        "q3\n"
    );
    assert!(denied(&md.0.join("private.txt")));
    // A file dave makes is his (gpg:FPR) alone.
    std::fs::write(md.0.join("dave.txt"), "dave\n").unwrap();
    assert_eq!(
        ok(&cloakfs(&["share", "list", s(&md.0.join("dave.txt"))])).trim(),
        format!("gpg:{fpr}")
    );
    assert!(denied(&ma.0.join("dave.txt")));

    // Withdrawn through alice's mount: dave's mount and his offline cat are shut out.
    ok(&with_gpg(
        f,
        &dave,
        &[
            "share",
            "remove",
            s(&plan),
            "--gpg-recipient",
            "dave@example.org",
        ],
    ));
    assert!(denied(&md.0.join("plan.txt")));
    assert_fails(&cat("plan.txt"), 6, "permission denied");
    assert_eq!(std::fs::read_to_string(&plan).unwrap(), "plan\n");
    md.unmount();
    ma.unmount();

    // fsck knows dave's gpg slot as a member: his entries (reports/q3.txt, dave.txt) are no
    // unknown keys, and dave.txt, his alone, is a file a member can open.
    let out = cloakfs(&["fsck", s(&f.cipher), "--identity", s(&t.alice.0), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sh = &r["sharing"];
    let gpg_key = serde_json::json!(format!("gpg:{fpr}"));
    assert!(
        sh["member_keys"].as_array().unwrap().contains(&gpg_key),
        "{sh}"
    );
    assert!(
        sh["unknown_keys"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e[1] != gpg_key),
        "{sh}"
    );
    assert!(
        !sh["no_member_can_open"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("/dave.txt")),
        "{sh}"
    );
}

#[test]
fn bad_gpg_recipients_fail_with_one_clear_line() {
    let dave = GnuPgHome::new(&["Dave <dave@example.org>"]);
    let twins = GnuPgHome::new(&["Twin One <twin@example.org>", "Twin Two <twin@example.org>"]);
    let t = team();
    let f = &t.f;
    let offline = |home: &GnuPgHome, id: &str| {
        with_gpg(
            f,
            home,
            &[
                "share",
                "add",
                "--volume",
                s(&f.cipher),
                "--identity",
                s(&t.alice.0),
                "plan.txt",
                "--gpg-recipient",
                id,
            ],
        )
    };
    assert_fails(
        &offline(&dave, "nobody@example.org"),
        2,
        "no gpg key \"nobody@example.org\" in the keyring",
    );
    assert_fails(
        &offline(&twins, "twin@example.org"),
        2,
        "matches 2 keys: give the full fingerprint of one",
    );
    // --gpg alone cannot tell which of two secret keys owns new files.
    ok(&with_gpg(
        f,
        &twins,
        &[
            "slots",
            "add",
            s(&f.cipher),
            "--passfile",
            s(&f.pass),
            "--gpg-recipient",
            "Twin One",
        ],
    ));
    assert_fails(
        &with_gpg(f, &twins, &["cat", s(&f.cipher), "plan.txt", "--gpg"]),
        2,
        "the gpg keyring has 2 secret keys",
    );

    // A volume that is not a sharing one, mounted and offline.
    let plain = Fixture::new();
    let m = plain.mounted(&[]);
    std::fs::write(m.0.join("f.txt"), "x").unwrap();
    assert_fails(
        &with_gpg(
            &plain,
            &dave,
            &[
                "share",
                "add",
                s(&m.0.join("f.txt")),
                "--gpg-recipient",
                "dave@example.org",
            ],
        ),
        3,
        "not a sharing volume",
    );
    m.unmount();
    assert_fails(
        &with_gpg(
            &plain,
            &dave,
            &[
                "share",
                "add",
                "--volume",
                s(&plain.cipher),
                "--passfile",
                s(&plain.pass),
                "f.txt",
                "--gpg-recipient",
                "dave@example.org",
            ],
        ),
        3,
        "not a sharing volume",
    );
}

/// What a storage attacker who holds no key and is no member makes (issue 40, attack 1): a
/// file key of their choosing wrapped to `recipients` (public keys, which they know), a list
/// MAC under it, and one block of `text`, written over backing file `backing`. Their header
/// MAC key is anything but the volume's.
fn plant_forged_file(backing: &Path, recipients: &[String], text: &[u8]) {
    use cloakfs_core::crypto::secret::SecretBytes;
    use cloakfs_core::format::content::{ContentCodec, ContentSuite};
    use cloakfs_core::format::filekey::HeaderMacKey;
    let not_the_volume_s = HeaderMacKey::new(SecretBytes::random(), false);
    let codec =
        ContentCodec::new_wrapped(ContentSuite::Aes256Gcm, 4096, false, None, not_the_volume_s);
    let (header, opened) = codec.fresh_header(recipients).unwrap();
    let mut block = vec![0u8; text.len() + 28];
    opened.cipher.seal(0, text, &mut block);
    std::fs::write(backing, [header, block].concat()).unwrap();
}

fn is_eio(r: std::io::Result<impl Sized>) -> bool {
    r.is_err_and(|e| e.raw_os_error() == Some(libc::EIO))
}

/// Issue 40, attack 1: a file planted by the storage (a key of the attacker's wrapped to the
/// owner and to the attacker) is refused by the mount, `cat` and `fsck`; the owner never
/// reads the planted text nor writes under the attacker's key.
#[test]
fn a_file_planted_without_the_volume_key_is_refused() {
    let t = team();
    let (_, attacker) = age_key(t.f.tmp.path(), "attacker.key");
    let ma = t.mount(&t.alice, "alice");
    std::fs::write(ma.0.join("notes.txt"), "mine\n").unwrap();
    ma.unmount();
    let backing = only_file(&t.f.cipher);
    plant_forged_file(&backing, &[t.alice.1.clone(), attacker], b"planted\n");
    let planted = std::fs::read(&backing).unwrap();

    let ma = t.mount(&t.alice, "alice");
    assert!(is_eio(std::fs::read(ma.0.join("notes.txt"))));
    let append = std::fs::OpenOptions::new()
        .append(true)
        .open(ma.0.join("notes.txt"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"secret\n"));
    assert!(is_eio(append));
    let truncate = std::fs::write(ma.0.join("notes.txt"), "secret\n");
    assert!(
        truncate.is_err(),
        "an O_TRUNC rewrite kept the planted list"
    );
    ma.unmount();
    // Nothing of the owner's went into the planted file.
    assert_eq!(std::fs::read(&backing).unwrap(), planted);
    assert_fails(&t.cat(&t.alice, "notes.txt"), 6, "volume key");
    let out =
        t.f.run(&["fsck", s(&t.f.cipher), "--identity", s(&t.alice.0)]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("/notes.txt") && text.contains("volume key"),
        "{text}"
    );
    // fsck needs no member identity to see it: the volume key is enough.
    let out =
        t.f.run(&["fsck", s(&t.f.cipher), "--passfile", s(&t.f.pass)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("volume key"));
}

/// The config of `t`'s volume and its file headers as a cloakfs before 2026-11-28 made them:
/// no `shared_header_mac`, no volume MAC in any header.
fn as_made_before_header_macs(t: &Team) {
    use cloakfs_core::crypto::secret::Passphrase;
    use cloakfs_core::format::filekey::SharedHeader;
    let pass = std::fs::read(&t.f.pass).unwrap();
    let pass = Passphrase::new(pass.trim_ascii_end().to_vec());
    let volume = cloakfs_core::Volume::unlock(&t.f.cipher, &pass).unwrap();
    let mut config = volume.config().clone();
    config.params.shared_header_mac = false;
    config.seal(volume.master_key());
    config.save(&t.f.cipher).unwrap();
    for e in std::fs::read_dir(&t.f.cipher).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("cloakfs.") || !p.is_file() {
            continue;
        }
        let mut b = std::fs::read(&p).unwrap();
        let h = SharedHeader::parse(&b[..4096]).unwrap();
        let at = h.volume_mac_offset().unwrap() as usize;
        b[at..at + 32].fill(0);
        std::fs::write(&p, b).unwrap();
    }
}

/// A sharing volume made before header MACs: open to attack 1 (and told so at every mount),
/// until `cloakfs upgrade`, after which a planted file is refused and the owner's files read
/// as before.
#[test]
fn upgrade_closes_an_older_volume_to_planted_files() {
    let t = team();
    let (_, attacker) = age_key(t.f.tmp.path(), "attacker.key");
    let ma = t.mount(&t.alice, "alice");
    std::fs::write(ma.0.join("notes.txt"), "mine\n").unwrap();
    std::fs::write(ma.0.join("other.txt"), "other\n").unwrap();
    ma.unmount();
    as_made_before_header_macs(&t);
    let info = ok(&t.f.run(&["info", s(&t.f.cipher)]));
    assert!(
        info.contains("NOT authenticated under the volume key"),
        "{info}"
    );
    let backing = std::fs::read_dir(&t.f.cipher)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let name = [
                "name",
                "-d",
                "--passfile",
                s(&t.f.pass),
                s(&t.f.cipher),
                s(p),
            ];
            !p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("cloakfs.")
                && ok(&t.f.run(&name)).contains("other.txt")
        })
        .expect("other.txt's backing file");
    let genuine = std::fs::read(&backing).unwrap();
    // The attack as it stands on such a volume: the planted text is served as the owner's.
    plant_forged_file(
        &backing,
        &[t.alice.1.clone(), attacker.clone()],
        b"planted\n",
    );
    let (old, said) = t.mount_on(&t.f.state, &t.alice, "old");
    assert!(said.contains("cloakfs upgrade"), "{said}");
    assert_eq!(
        std::fs::read_to_string(old.0.join("notes.txt")).unwrap(),
        "mine\n"
    );
    assert_eq!(
        std::fs::read_to_string(old.0.join("other.txt")).unwrap(),
        "planted\n"
    );
    // Refused while mounted, in one line, and nothing changes.
    assert_fails(
        &t.f.run(&["upgrade", "--passfile", s(&t.f.pass), s(&t.f.cipher)]),
        8,
        "unmount it first",
    );
    old.unmount();
    std::fs::write(&backing, &genuine).unwrap();
    // A name that does not decrypt would be left unreadable: refused, nothing changed.
    let junk = t.f.cipher.join("AAAAAAAAAAAAAAAAAAAAAAAAAA");
    std::fs::write(&junk, "").unwrap();
    assert_fails(
        &t.f.run(&["upgrade", "--passfile", s(&t.f.pass), s(&t.f.cipher)]),
        2,
        "run `cloakfs fsck` first",
    );
    let info = ok(&t.f.run(&["info", s(&t.f.cipher)]));
    assert!(info.contains("NOT authenticated"), "{info}");
    std::fs::remove_file(&junk).unwrap();

    let up = ok(&t
        .f
        .run(&["upgrade", "--passfile", s(&t.f.pass), s(&t.f.cipher)]));
    assert!(up.contains("2 file headers"), "{up}");
    let again = ok(&t
        .f
        .run(&["upgrade", "--passfile", s(&t.f.pass), s(&t.f.cipher)]));
    assert!(again.contains("current format already"), "{again}");
    let info = ok(&t.f.run(&["info", s(&t.f.cipher)]));
    assert!(
        info.contains("headers authenticated under the volume key"),
        "{info}"
    );

    // The owner's files read as before; one planted now is refused.
    assert_eq!(ok(&t.cat(&t.alice, "other.txt")), "other\n");
    plant_forged_file(&backing, &[t.alice.1.clone(), attacker], b"planted\n");
    let ma = t.mount(&t.alice, "alice");
    let out = ma.0.clone();
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "mine\n"
    );
    assert!(is_eio(std::fs::read(out.join("other.txt"))));
    ma.unmount();
}

/// `cloakfs cat` of `path` as `who`, on a machine whose record of known volumes is `state`.
fn cat_on(t: &Team, state: &Path, who: &(PathBuf, String), path: &str) -> Output {
    t.f.bin()
        .env("CLOAKFS_STATE_DIR", state)
        .args(["cat", s(&t.f.cipher), path, "--identity", s(&who.0)])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// Issue 40, attack 2: the storage keeps a copy of a file, the owner withdraws it from bob,
/// the storage puts the copy back. The copy (its file ID retired by the withdrawal) is refused
/// on the owner's machine and on any machine that sees the volume's record; the owner's next
/// writes never go under the key bob holds. With the volume's record deleted too, the owner's
/// machine still refuses it.
#[test]
fn a_withdrawal_rolled_back_by_the_storage_is_refused() {
    let t = team();
    let ma = t.mount(&t.alice, "alice");
    let plan = ma.0.join("plan.txt");
    std::fs::write(&plan, "plan\n").unwrap();
    ok(&cloakfs(&[
        "share",
        "add",
        s(&plan),
        "--recipient",
        &t.bob.1,
    ]));
    let backing = only_file(&t.f.cipher);
    let copy = std::fs::read(&backing).unwrap();
    ok(&cloakfs(&[
        "share",
        "remove",
        s(&plan),
        "--recipient",
        &t.bob.1,
    ]));
    ma.unmount();
    std::fs::write(&backing, &copy).unwrap();

    let ma = t.mount(&t.alice, "alice");
    assert!(is_eio(std::fs::read(&plan)));
    let append = std::fs::OpenOptions::new()
        .append(true)
        .open(&plan)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"for alice only\n"));
    assert!(is_eio(append));
    ma.unmount();
    assert_eq!(
        std::fs::read(&backing).unwrap(),
        copy,
        "written under bob's key"
    );
    assert_fails(&t.cat(&t.alice, "plan.txt"), 6, "retired by `share remove`");
    let out =
        t.f.run(&["fsck", s(&t.f.cipher), "--identity", s(&t.alice.0)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("rollback"));
    // Another machine learns it from the volume's record (after its first-use notice).
    let other = t.f.tmp.path().join("other-machine");
    let out = cat_on(&t, &other, &t.alice, "plan.txt");
    assert_eq!(out.status.code(), Some(6));
    assert!(stderr(&out).contains("retired"), "{}", stderr(&out));
    // The record rolled back too: what each machine has seen stays refused.
    std::fs::remove_dir_all(t.f.cipher.join("cloakfs.retired")).unwrap();
    assert_fails(&t.cat(&t.alice, "plan.txt"), 6, "retired");
    assert_fails(&cat_on(&t, &other, &t.alice, "plan.txt"), 6, "retired");
    // A machine that never saw either cannot tell (THREAT-MODEL says so).
    let third = t.f.tmp.path().join("third-machine");
    assert_eq!(ok(&cat_on(&t, &third, &t.alice, "plan.txt")), "plan\n");
}

/// Issue 40, attack 3: a member sets the root's default recipients to themself. The owner's new
/// files are not granted to that key until the owner sets it as a default too; the setting is
/// shown at mount, by `share default` and by `fsck`.
#[test]
fn a_default_recipient_set_by_another_member_is_shown_not_applied() {
    let t = team();
    // Bob is another person: his own machine's records.
    let (mb, _) = t.mount_on(&t.f.tmp.path().join("bob-machine"), &t.bob, "bob");
    ok(&cloakfs(&[
        "share",
        "default",
        s(&mb.0),
        "--recipient",
        &t.bob.1,
    ]));
    std::fs::write(mb.0.join("bobs.txt"), "bob's\n").unwrap();
    let listed = ok(&cloakfs(&["share", "list", s(&mb.0.join("bobs.txt"))]));
    assert_eq!(
        listed.trim(),
        t.bob.1,
        "bob's own default applies to his files"
    );

    let (ma, said) = t.mount_on(&t.f.state, &t.alice, "alice");
    assert!(
        said.contains("default recipients") && said.contains(&t.bob.1),
        "{said}"
    );
    std::fs::write(ma.0.join("mine.txt"), "mine\n").unwrap();
    let listed = ok(&cloakfs(&["share", "list", s(&ma.0.join("mine.txt"))]));
    assert_eq!(
        listed.trim(),
        t.alice.1,
        "granted to a key alice never chose"
    );
    assert!(denied(&mb.0.join("mine.txt")));
    let shown = ok(&cloakfs(&["share", "default", s(&ma.0)]));
    assert!(
        shown.contains(&t.bob.1) && shown.contains("not applied"),
        "{shown}"
    );
    let out =
        t.f.run(&["fsck", s(&t.f.cipher), "--identity", s(&t.alice.0)]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!(
            "/: new files made in it are granted by default to {}",
            t.bob.1
        )),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Alice agrees by setting it herself: her next files are granted to bob too.
    ok(&cloakfs(&[
        "share",
        "default",
        s(&ma.0),
        "--recipient",
        &t.bob.1,
    ]));
    std::fs::write(ma.0.join("ours.txt"), "ours\n").unwrap();
    assert_eq!(
        std::fs::read_to_string(mb.0.join("ours.txt")).unwrap(),
        "ours\n"
    );
    ma.unmount();
    mb.unmount();
}

/// `cloakfs upgrade` of a volume that is not a sharing one has nothing to do.
#[test]
fn upgrade_of_a_current_volume_changes_nothing() {
    let f = Fixture::new();
    let before = std::fs::read(f.cipher.join("cloakfs.conf")).unwrap();
    let out = ok(&f.run(&["upgrade", "--passfile", s(&f.pass), s(&f.cipher)]));
    assert!(out.contains("current format already"), "{out}");
    assert_eq!(
        std::fs::read(f.cipher.join("cloakfs.conf")).unwrap(),
        before
    );
    assert_fails(
        &f.run(&[
            "upgrade",
            "--passfile",
            s(&f.pass),
            s(&f.tmp.path().join("nowhere")),
        ]),
        3,
        "nowhere",
    );
}
