//! The `cloakfs` command end to end: volume creation, mounting in its several forms, and every
//! kind of bad input the core issue lists. Real FUSE mounts throughout.

mod common;

use common::*;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

#[test]
fn init_creates_volume_and_refuses_existing_or_nonempty() {
    let f = Fixture::new();
    assert!(f.cipher.join("cloakfs.conf").is_file());
    assert_fails(&f.init(&[]), 3, "already holds a cloakfs volume");

    let g = Fixture::bare();
    std::fs::create_dir(&g.cipher).unwrap();
    std::fs::write(g.cipher.join("stray"), "x").unwrap();
    assert_fails(&g.init(&[]), 2, "not empty");
}

#[test]
fn info_shows_parameters_without_secret() {
    let f = Fixture::bare();
    assert!(f
        .init(&["--cipher", "xchacha20-poly1305", "--strict-holes"])
        .status
        .success());
    let out = cloakfs(&["info", s(&f.cipher)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("xchacha20-poly1305"), "{text}");
    assert!(text.contains("strict"), "{text}");
    assert!(text.contains("slot 1: passphrase"), "{text}");

    let out = cloakfs(&["info", "--json", s(&f.cipher)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["content_cipher"], "xchacha20-poly1305");
    assert_eq!(v["holes"], "strict");
    assert_eq!(v["format_version"], 1);
    assert_eq!(v["sharing"], false);
    assert_eq!(v["slots"][0]["kind"], "passphrase");
    assert_eq!(v["slots"][0]["id"], 1);
    assert_eq!(v["volume_id"].as_str().unwrap().len(), 22, "{v}");

    // Bad input: one line, non-zero.
    assert_fails(
        &cloakfs(&["info", "--json", "/no/such/dir"]),
        3,
        "/no/such/dir",
    );
}

#[test]
fn unmount_of_a_busy_mount_names_what_holds_it() {
    let f = Fixture::new();
    let m = f.mounted(&[]);
    std::fs::create_dir(f.mnt.join("work")).unwrap();
    std::fs::write(f.mnt.join("work/open.txt"), b"x").unwrap();
    // A reader sitting in the mount (waiting on its stdin), and one holding a file open from
    // outside it (tail -f never closes it).
    let mnt = std::fs::canonicalize(&f.mnt).unwrap();
    struct Held(Vec<std::process::Child>);
    impl Drop for Held {
        fn drop(&mut self) {
            for h in &mut self.0 {
                let _ = h.kill();
                let _ = h.wait();
            }
        }
    }
    let holders = Held(
        [
            (mnt.join("work"), "exec cat".to_string()),
            (
                f.tmp.path().to_path_buf(),
                format!("exec tail -f {}", s(&mnt.join("work/open.txt"))),
            ),
        ]
        .into_iter()
        .map(|(dir, script)| {
            Command::new("sh")
                .arg("-c")
                .arg(script)
                .current_dir(dir)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect(),
    );
    // Until both hold it, as /proc shows them.
    let (a, b) = (holders.0[0].id(), holders.0[1].id());
    let holds = |pid: u32, link: &str| {
        std::fs::read_link(format!("/proc/{pid}/{link}")).is_ok_and(|p| p.starts_with(&mnt))
    };
    let opened = |pid: u32| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|p| p.starts_with(&mnt)))
        })
    };
    while !(holds(a, "cwd") && opened(b)) {
        std::thread::yield_now();
    }
    let out = cloakfs(&["unmount", s(&f.mnt)]);
    assert_fails(&out, 4, "it is in use: ");
    let err = stderr(&out);
    assert!(
        err.contains(&format!("process {a} (cat) has its current directory")),
        "{err}"
    );
    assert!(
        err.contains(&format!("process {b} (tail) has an open file")),
        "{err}"
    );
    assert!(err.contains("open.txt"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    drop(holders);
    // Released: the unmount goes through.
    m.unmount();
}

#[test]
fn mount_daemonizes_and_unmount_flushes() {
    let f = Fixture::new();
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("a.txt"), b"persisted through unmount").unwrap();
    m.unmount();
    assert!(std::fs::read_dir(&f.mnt).unwrap().next().is_none());
    let m = f.mounted(&[]);
    assert_eq!(
        std::fs::read(f.mnt.join("a.txt")).unwrap(),
        b"persisted through unmount"
    );
    m.unmount();
}

#[test]
fn foreground_mount_stays_attached_until_unmounted() {
    let f = Fixture::new();
    let (mut child, line) = start_until_first_line(
        bin()
            .args(["mount", "--foreground", "--passfile", s(&f.pass)])
            .args([s(&f.cipher), s(&f.mnt)])
            .stderr(Stdio::piped()),
    );
    assert_eq!(line.trim(), "Filesystem mounted and ready.");
    let guard = MountGuard(f.mnt.clone());
    std::fs::write(f.mnt.join("x"), b"1").unwrap();
    assert!(
        child.try_wait().unwrap().is_none(),
        "foreground process must stay"
    );
    guard.unmount();
    let status = child.wait().unwrap();
    assert!(status.success(), "foreground daemon exit: {status}");
}

#[test]
fn wrong_passphrase_is_refused_before_mounting() {
    let f = Fixture::new();
    let wrong = f.write_pass("not the passphrase");
    let out = cloakfs(&["mount", "--passfile", s(&wrong), s(&f.cipher), s(&f.mnt)]);
    assert_fails(&out, 1, "wrong passphrase");
    assert!(!is_mounted(&f.mnt));
}

#[test]
fn extpass_and_stdin_passphrase_sources() {
    let f = Fixture::new();
    let cmd = format!("cat {}", s(&f.pass));
    let out = cloakfs(&["mount", "--extpass", &cmd, s(&f.cipher), s(&f.mnt)]);
    assert!(out.status.success(), "{}", stderr(&out));
    MountGuard(f.mnt.clone()).unmount();

    let mut child = bin()
        .args(["mount", "--passfile", "-", s(&f.cipher), s(&f.mnt)])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"correct horse battery\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    MountGuard(f.mnt.clone()).unmount();
}

#[test]
fn no_terminal_and_no_passfile_is_a_clear_error() {
    let f = Fixture::new();
    let out = cloakfs(&["mount", s(&f.cipher), s(&f.mnt)]);
    assert_fails(&out, 2, "--passfile");
}

#[test]
fn missing_config_is_not_a_volume() {
    let f = Fixture::bare();
    std::fs::create_dir(&f.cipher).unwrap();
    let out = f.mount(&[]);
    assert_fails(&out, 3, "no cloakfs volume");
}

#[test]
fn damaged_config_is_refused() {
    let f = Fixture::new();
    std::fs::write(
        f.cipher.join("cloakfs.conf"),
        "{\"cloakfs\": 1, \"volume\": ",
    )
    .unwrap();
    assert_fails(&f.mount(&[]), 3, "damaged volume config");
}

#[test]
fn unknown_format_version_is_refused() {
    let f = Fixture::new();
    let conf = f.cipher.join("cloakfs.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, text.replace("\"cloakfs\": 1", "\"cloakfs\": 7")).unwrap();
    assert_fails(&f.mount(&[]), 3, "unsupported config version 7");
    std::fs::write(
        &conf,
        text.replace("\"format_version\": \"1\"", "\"format_version\": \"2\""),
    )
    .unwrap();
    assert_fails(&f.mount(&[]), 3, "unsupported volume format version 2");
}

#[test]
fn flipped_config_flag_is_refused_after_unlock() {
    let f = Fixture::new();
    let conf = f.cipher.join("cloakfs.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, text.replace("\"sparse\"", "\"strict\"")).unwrap();
    assert_fails(&f.mount(&[]), 3, "modified without the key");
    assert!(!is_mounted(&f.mnt));
}

#[test]
fn nonempty_mountpoint_is_refused() {
    let f = Fixture::new();
    std::fs::write(f.mnt.join("already-here"), "x").unwrap();
    assert_fails(&f.mount(&[]), 4, "not empty");
    let m = f.mounted(&["-o", "nonempty"]);
    m.unmount();
}

#[test]
fn mounting_onto_a_mounted_volume_says_it_is_already_mounted() {
    let f = Fixture::new();
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("kept"), b"data").unwrap();
    let out = f.mount(&[]);
    assert_fails(&out, 4, "is already mounted: the cloakfs volume");
    assert!(!stderr(&out).contains("not empty"), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    // The mount there is untouched.
    assert_eq!(std::fs::read(f.mnt.join("kept")).unwrap(), b"data");
    m.unmount();
}

/// Mount options of the mount at `p`, per /proc/self/mountinfo.
fn mount_options_of(p: &std::path::Path) -> String {
    let p = std::fs::canonicalize(p).unwrap();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap()))
        .unwrap()
        .to_string();
    line.split(' ').nth(5).unwrap().to_string()
}

#[test]
fn a_read_only_cipher_directory_is_mounted_read_only_with_a_notice() {
    let f = Fixture::new();
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("kept"), b"data").unwrap();
    m.unmount();
    // The store goes read-only (a read-only bind mount: as root, a mode without w would not
    // stop anything).
    let ro = f.tmp.path().join("ro-store");
    std::fs::create_dir(&ro).unwrap();
    let bind = |args: &[&str]| {
        let st = Command::new("mount").args(args).status().unwrap();
        assert!(st.success());
    };
    bind(&["--bind", s(&f.cipher), s(&ro)]);
    bind(&["-o", "remount,bind,ro", s(&ro)]);
    let _unbind = Detach(ro.clone());

    let out = f.run(&["mount", "--passfile", s(&f.pass), s(&ro), s(&f.mnt)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is read-only (on a read-only file system): mounting read-only"),
        "{}",
        stderr(&out)
    );
    let guard = MountGuard(f.mnt.clone());
    assert!(
        mount_options_of(&f.mnt).split(',').any(|o| o == "ro"),
        "{}",
        mount_options_of(&f.mnt)
    );
    assert_eq!(std::fs::read(f.mnt.join("kept")).unwrap(), b"data");
    let err = std::fs::write(f.mnt.join("new"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    guard.unmount();
}

#[test]
fn read_only_mount_refuses_writes() {
    let f = Fixture::new();
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("kept"), b"data").unwrap();
    m.unmount();
    let m = f.mounted(&["-o", "ro"]);
    assert_eq!(std::fs::read(f.mnt.join("kept")).unwrap(), b"data");
    let err = std::fs::write(f.mnt.join("new"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    m.unmount();
}

#[test]
fn transport_options_are_taken_as_flags_and_as_mount_options() {
    let f = Fixture::new();
    for extra in [
        &["--no-busy-poll", "--no-io-uring"][..],
        &["-o", "no_busy_poll,no_io_uring"][..],
    ] {
        let m = f.mounted(extra);
        std::fs::write(f.mnt.join("t"), b"served").unwrap();
        assert_eq!(std::fs::read(f.mnt.join("t")).unwrap(), b"served");
        m.unmount();
    }
    assert_fails(&f.mount(&["-o", "no_busy_poll=1"]), 2, "no_busy_poll");
}

#[test]
fn unknown_mount_option_is_a_usage_error() {
    let f = Fixture::new();
    assert_fails(&f.mount(&["-o", "frobnicate"]), 2, "unknown mount option");
}

#[test]
fn unmount_refuses_a_non_cloakfs_directory() {
    let f = Fixture::bare();
    assert_fails(
        &cloakfs(&["unmount", s(&f.mnt)]),
        2,
        "not a cloakfs mount point",
    );
}

/// Puts the binary under test where mount(8)'s helpers look (their PATH is reset to
/// /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin), unless a real install is there.
struct InstalledBin(Option<std::path::PathBuf>);

impl InstalledBin {
    fn new() -> Self {
        let link = std::path::PathBuf::from("/usr/local/bin/cloakfs");
        match std::fs::symlink_metadata(&link) {
            Ok(m) if !m.file_type().is_symlink() => return Self(None),
            Ok(_) => std::fs::remove_file(&link).unwrap(),
            Err(_) => {}
        }
        std::os::unix::fs::symlink(BIN, &link).unwrap();
        Self(Some(link))
    }
}

impl Drop for InstalledBin {
    fn drop(&mut self) {
        if let Some(l) = &self.0 {
            let _ = std::fs::remove_file(l);
        }
    }
}

fn mounted_line(mnt: &std::path::Path) -> String {
    let mnt = std::fs::canonicalize(mnt).unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(s(&mnt)))
        .map(str::to_string)
        .unwrap_or_default()
}

/// `mount -t fuse.cloakfs` and an fstab line: mount(8) runs mount.fuse3, which runs
/// `cloakfs CIPHERDIR MOUNTPOINT -o OPTIONS`.
#[test]
fn mount_t_fuse_cloakfs_and_fstab_entry() {
    let _bin = InstalledBin::new();
    let f = Fixture::new();
    let opts = format!("passfile={},noexec", s(&f.pass));
    let out = Command::new("mount")
        .args(["-t", "fuse.cloakfs", s(&f.cipher), s(&f.mnt), "-o", &opts])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    // mount(8) runs /sbin/mount.fuse.cloakfs, where one exists, in place of mount.fuse3.
    let helper = std::path::Path::new("/sbin/mount.fuse.cloakfs");
    assert!(
        out.status.success(),
        "mount -t fuse.cloakfs: {}{}",
        stderr(&out),
        if helper.exists() {
            " (mount(8) ran /sbin/mount.fuse.cloakfs in place of mount.fuse3: a leftover?)"
        } else {
            ""
        }
    );
    let guard = MountGuard(f.mnt.clone());
    let line = mounted_line(&f.mnt);
    assert!(line.contains("fuse.cloakfs"), "{line}");
    assert!(line.contains("noexec"), "{line}");
    std::fs::write(f.mnt.join("via-mount-t"), b"ok").unwrap();
    guard.unmount();

    let fstab = f.tmp.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# test fstab\n{} {} fuse.cloakfs passfile={},nofail,nosuid,x-test.opt 0 0\n",
            s(&f.cipher),
            s(&std::fs::canonicalize(&f.mnt).unwrap()),
            s(&f.pass)
        ),
    )
    .unwrap();
    let out = Command::new("mount")
        .args([
            "--fstab",
            s(&fstab),
            s(&std::fs::canonicalize(&f.mnt).unwrap()),
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "mount via fstab: {}", stderr(&out));
    let guard = MountGuard(f.mnt.clone());
    assert!(mounted_line(&f.mnt).contains("nosuid"));
    assert_eq!(std::fs::read(f.mnt.join("via-mount-t")).unwrap(), b"ok");
    guard.unmount();
}

fn in_mount_namespace(script: &str) -> std::process::Output {
    Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn missing_dev_fuse_is_a_clear_error() {
    let f = Fixture::new();
    let script = format!(
        "mount -t tmpfs none /dev && exec {BIN} mount --passfile {} {} {}",
        s(&f.pass),
        s(&f.cipher),
        s(&f.mnt)
    );
    assert_fails(&in_mount_namespace(&script), 4, "/dev/fuse is missing");
}

#[test]
fn missing_fusermount3_for_a_user_is_a_clear_error() {
    let f = Fixture::new();
    // The unprivileged user must be able to reach the volume and its passfile.
    for p in [f.tmp.path(), &f.cipher, &f.mnt] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    for p in [f.pass.clone(), f.cipher.join("cloakfs.conf")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let hide: String = ["/usr/bin/fusermount3", "/bin/fusermount3"]
        .iter()
        .filter(|p| std::path::Path::new(p).exists())
        .map(|p| format!("mount --bind /dev/null {p} && "))
        .collect();
    let script = format!(
        "{hide}exec setpriv --reuid=65534 --regid=65534 --clear-groups {BIN} mount --passfile {} {} {}",
        s(&f.pass),
        s(&f.cipher),
        s(&f.mnt)
    );
    assert_fails(&in_mount_namespace(&script), 4, "fusermount3 not found");
}

/// A volume on a tmpfs of `size` (e.g. "3m"), mounted on `f.mnt`; the guards unmount both.
fn small_disk_volume(f: &Fixture, size: &str) -> (MountGuard, impl Drop) {
    let small = f.tmp.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let st = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size}"),
            "cloakfs-test",
            s(&small),
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let tmpfs = Detach(small.clone());
    let cipher = small.join("cipher");
    let out = cloakfs(
        &[
            &["init", "--passfile", s(&f.pass)][..],
            &CHEAP_KDF[..],
            &[s(&cipher)],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = cloakfs(&["mount", "--passfile", s(&f.pass), s(&cipher), s(&f.mnt)]);
    assert!(out.status.success(), "{}", stderr(&out));
    (MountGuard(f.mnt.clone()), tmpfs)
}

/// Writes `path` until the disk is full; the error must be ENOSPC, on write or fsync.
fn fill_disk(path: &std::path::Path) {
    let mut big = std::fs::File::create(path).unwrap();
    let chunk = vec![0x5au8; 64 * 1024];
    for _ in 0..2000 {
        if let Err(e) = big.write_all(&chunk).and_then(|_| big.sync_all()) {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
            return;
        }
    }
    panic!("the disk never filled up");
}

/// A full backing disk: ENOSPC reaches the writer, and what was written before stays intact.
#[test]
fn full_disk_surfaces_enospc_and_keeps_data() {
    let f = Fixture::bare();
    let (guard, _tmpfs) = small_disk_volume(&f, "3m");

    let keep: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(f.mnt.join("keep"), &keep).unwrap();
    fill_disk(&f.mnt.join("big"));
    let chunk = vec![0x5au8; 64 * 1024];
    // Appending to the kept file fails too, without damaging its existing bytes.
    let mut k = std::fs::OpenOptions::new()
        .append(true)
        .open(f.mnt.join("keep"))
        .unwrap();
    let _ = k.write_all(&chunk).and_then(|_| k.sync_all());
    drop(k);
    let back = std::fs::read(f.mnt.join("keep")).unwrap();
    assert!(back.len() >= keep.len());
    assert_eq!(&back[..keep.len()], &keep[..]);
    guard.unmount();
}

/// xfstests' shrinking truncate on a full disk: the new last block is sealed over a block
/// that was a hole, whose backing range starts in an allocated page and ends in an
/// unallocated one. The plain file system succeeds (a shrink needs no space); so must cloakfs,
/// and the file must read back whole, never as a block that fails authentication.
#[test]
fn a_shrinking_truncate_into_a_hole_on_a_full_disk_succeeds_and_reads_back() {
    let f = Fixture::bare();
    let (guard, _tmpfs) = small_disk_volume(&f, "3m");
    let path = f.mnt.join("sparse");
    // The same file on the plain tmpfs beside the volume.
    let plain = f.tmp.path().join("small").join("plain-beside");
    let head: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    for p in [&path, &plain] {
        let file = std::fs::File::create(p).unwrap();
        use std::os::unix::fs::FileExt;
        // Block 0 data, blocks 1-3 holes, block 4 data: block 1's backing range starts in the
        // page that holds block 0's end, and runs into a page that was never written.
        file.write_all_at(&head, 0).unwrap();
        file.write_all_at(&[9u8; 4096], 4 * 4096).unwrap();
        file.sync_all().unwrap();
    }
    // Full to the last page: a plain file on the tmpfs itself, in ever smaller writes.
    let mut filler = std::fs::File::create(f.tmp.path().join("small").join("filler")).unwrap();
    for n in [64 * 1024, 4096, 1] {
        while filler.write_all(&vec![1u8; n]).is_ok() {}
    }
    // 4,050 bytes of block 1: sealed, they reach past the allocated page.
    let new_size = 4096 + 4050;
    let shrink = |p: &std::path::Path| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .and_then(|file| file.set_len(new_size))
    };
    // cloakfs first: the plain file's shrink frees a page.
    let r = shrink(&path);
    shrink(&plain).expect("the plain tmpfs shrinks a file on a full disk");
    assert!(r.is_ok(), "truncate on a full disk: {r:?}");
    let back = std::fs::read(&path).expect("the file reads back");
    assert_eq!(back.len() as u64, new_size);
    assert_eq!(&back[..4096], &head[..]);
    assert!(back[4096..].iter().all(|&b| b == 0));
    assert_eq!(back, std::fs::read(&plain).unwrap());
    guard.unmount();
}

/// A mount in the background (forked after the file system was built) syncs the IDs of new
/// directories on its sync thread: more directories than its queue holds, then a rename of an
/// older file into the last one and an fsync of that directory, which wait for the syncs.
#[test]
fn a_background_mount_syncs_new_directory_ids() {
    let f = Fixture::new();
    let m = f.mounted(&[]);
    std::fs::write(f.mnt.join("old"), b"older data").unwrap();
    let dirs: Vec<_> = (0..40).map(|i| f.mnt.join(format!("d{i}"))).collect();
    for d in &dirs {
        std::fs::create_dir(d).unwrap();
    }
    let last = dirs.last().unwrap();
    std::fs::rename(f.mnt.join("old"), last.join("old")).unwrap();
    std::fs::File::open(last).unwrap().sync_all().unwrap();
    m.unmount();
    let mut backing_dirs = 0;
    for e in std::fs::read_dir(&f.cipher).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            let name = e.file_name();
            assert!(
                !name.to_string_lossy().starts_with("cloakfs."),
                "{name:?} left"
            );
            let id = std::fs::read(e.path().join("cloakfs.dirid")).unwrap();
            assert_eq!(id.len(), 16, "{name:?}");
            backing_dirs += 1;
        }
    }
    assert_eq!(backing_dirs, dirs.len());
    let m = f.mounted(&[]);
    assert_eq!(std::fs::read(last.join("old")).unwrap(), b"older data");
    m.unmount();
}

/// SIGTERM to the daemon unmounts cleanly instead of leaving a dead mount behind.
#[test]
fn sigterm_unmounts_and_keeps_data() {
    let f = Fixture::new();
    let (mut child, _ready) = start_until_first_line(
        bin()
            .args(["mount", "-f", "--passfile", s(&f.pass)])
            .args([s(&f.cipher), s(&f.mnt)]),
    );
    let guard = MountGuard(f.mnt.clone());
    std::fs::write(f.mnt.join("before-term"), b"kept").unwrap();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "daemon exit after SIGTERM: {status}");
    assert!(!is_mounted(&f.mnt), "SIGTERM must unmount");
    std::mem::forget(guard);
    let m = f.mounted(&[]);
    assert_eq!(std::fs::read(f.mnt.join("before-term")).unwrap(), b"kept");
    m.unmount();
}

/// An interrupted rekey leaves a journal; mounting then would show a half-converted volume.
#[test]
fn mount_refuses_a_volume_with_an_unfinished_rekey() {
    let f = Fixture::new();
    std::fs::write(f.cipher.join("cloakfs.rekey"), "{}").unwrap();
    assert_fails(&f.mount(&[]), 8, "rekey");
    assert!(!is_mounted(&f.mnt));
}

/// Every node the kernel knows holds a descriptor, so a tree larger than the daemon's
/// descriptor limit must still work: the daemon has the kernel drop names it has not used
/// lately. Without that, creating file 2032 below fails with EMFILE. (Under a limit of 256
/// the pruning thread can fall behind on a loaded machine: see the closing note of #3.)
#[test]
fn a_tree_larger_than_the_descriptor_limit_stays_usable() {
    const LIMIT: u32 = 2048;
    const FILES: u32 = 6000;
    let f = Fixture::new();
    // setpriv drops CAP_SYS_RESOURCE, which would let the daemon raise the limit again.
    let (mut child, _ready) = start_until_first_line(
        Command::new("prlimit")
            .arg(format!("--nofile={LIMIT}:{LIMIT}"))
            .args([
                "setpriv",
                "--bounding-set=-sys_resource",
                BIN,
                "mount",
                "-f",
            ])
            .args(["--passfile", s(&f.pass), s(&f.cipher), s(&f.mnt)]),
    );
    let guard = MountGuard(f.mnt.clone());
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap()
        .to_string();
    assert_eq!(
        soft,
        LIMIT.to_string(),
        "the daemon must run under the test's limit"
    );

    let dir = f.mnt.join("many");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..FILES {
        std::fs::write(dir.join(format!("f{i:05}")), format!("content {i}\n"))
            .unwrap_or_else(|e| panic!("creating file {i}: {e}"));
    }
    // Every file read back by name. (Listing one directory far larger than a tiny limit
    // while statting it can still hit EMFILE: see docs/USAGE.md, "Open descriptors".)
    for i in 0..FILES {
        let got = std::fs::read_to_string(dir.join(format!("f{i:05}")))
            .unwrap_or_else(|e| panic!("reading file {i}: {e}"));
        assert_eq!(got, format!("content {i}\n"));
    }
    let fds = std::fs::read_dir(format!("/proc/{}/fd", child.id()))
        .unwrap()
        .count();
    assert!(fds < LIMIT as usize, "{fds} descriptors open");
    guard.unmount();
    assert!(child.wait().unwrap().success());
}
