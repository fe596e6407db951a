//! POSIX ACLs behave through a mount as on the backing file system (ext4 here): a named-user
//! entry denies or grants another user what the mode bits alone would not, a directory's
//! default ACL gives new entries their mode in place of the creator's umask, and the mode a
//! `setfacl` changes shows at once (issue 43, item 2; xfstests generic/099, 319, 375, 444).
//! Each check runs first in a plain directory beside the cipher directory, on the same file
//! system, so the test never asks of the mount more than the backing file system gives.
//! Real users (useradd, cfsl prefix), in a private view of the machine (common/machine.rs).

mod common;

use common::machine::{mounted_here, Machine, TestUser};
use common::{s, BIN, CHEAP_KDF};
use std::path::{Path, PathBuf};

const PASSWORD: &str = "Juniper-Falcon-29";

/// An owner with a volume (made with `init_args`) and a plain directory beside it, both in
/// their home, and another user.
struct Setup {
    _m: Machine,
    owner: TestUser,
    other: TestUser,
    bin: PathBuf,
    cipher: PathBuf,
    mnt: PathBuf,
    plain: PathBuf,
    pass: PathBuf,
}

impl Setup {
    fn new(tag: &str, init_args: &[&str]) -> Setup {
        let m = Machine::enter();
        m.allow_other_for_users();
        let bin = m.path("cloakfs");
        std::fs::copy(BIN, &bin).unwrap();
        let owner = m.user(&format!("cfsl-acl{tag}o"), PASSWORD);
        let other = m.user(&format!("cfsl-acl{tag}x"), PASSWORD);
        let pass = m.path("pass");
        std::fs::write(&pass, format!("{PASSWORD}\n")).unwrap();
        let home = owner.home.clone();
        let t = Setup {
            _m: m,
            bin,
            cipher: home.join("vault.enc"),
            mnt: home.join("vault"),
            plain: home.join("plain"),
            pass,
            owner,
            other,
        };
        let (rc, out) = t.owner.sh(&format!(
            "{b} init --passfile {p} {kdf} {args} {c} >/dev/null && mkdir {mnt} {plain}",
            b = s(&t.bin),
            p = s(&t.pass),
            kdf = CHEAP_KDF.join(" "),
            args = init_args.join(" "),
            c = s(&t.cipher),
            mnt = s(&t.mnt),
            plain = s(&t.plain),
        ));
        assert_eq!(rc, 0, "{out}");
        // The other user may walk to both; the entries' own modes and ACLs decide the rest.
        std::fs::set_permissions(&home, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        t
    }

    fn mount(&self, opts: &str) {
        let (rc, out) = self.owner.sh(&format!(
            "{} mount --passfile {} {opts} {} {}",
            s(&self.bin),
            s(&self.pass),
            s(&self.cipher),
            s(&self.mnt)
        ));
        assert_eq!(rc, 0, "mount: {out}");
        assert!(mounted_here(&self.mnt));
    }

    /// What the owner, then the other user, see of ACLs in `dir`.
    fn acl_behaviour(&self, dir: &Path) -> (String, String) {
        let x = &self.other.name;
        let (rc, owner) = self.owner.sh(&format!(
            "cd {dir} && umask 022 && \
             echo secret > open && chmod 644 open && \
             echo shared > closed && chmod 600 closed && \
             echo x > fresh && chmod 600 fresh && stat -c 'fresh before %a' fresh && \
             setfacl -m u:{x}:--- open && setfacl -m u:{x}:r closed && \
             setfacl -m u:{x}:rw fresh && stat -c 'fresh after %a' fresh && \
             mkdir inherit && setfacl -d -m u::rwx,g::r-x,o::r-x,u:{x}:rwx inherit && \
             (umask 077 && touch inherit/f && mkdir inherit/d && mkdir -m 555 inherit/ro) && \
             mkdir masked && (umask 027 && touch masked/f && mkdir masked/d) && \
             stat -c '%n %a' inherit/f inherit/d inherit/ro masked/f masked/d && \
             getfacl -c inherit/f inherit/d masked/f",
            dir = s(dir),
        ));
        assert_eq!(rc, 0, "owner in {}: {owner}", dir.display());
        let (_, other) = self.other.sh(&format!(
            "cd {dir} && \
             (cat open || echo 'open: denied') && \
             (cat closed || echo 'closed: denied') && \
             (echo more >> inherit/f && echo 'inherit/f: written' || echo 'inherit/f: denied') \
             && (touch inherit/d/g && echo 'inherit/d: written' || echo 'inherit/d: denied')",
            dir = s(dir),
        ));
        (owner, other)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if mounted_here(&self.mnt) {
            let _ = self
                .owner
                .command(&self.bin)
                .args(["unmount", "-z"])
                .arg(&self.mnt)
                .output();
        }
    }
}

/// The mount behaves as the plain directory beside it, which behaves as ext4 does.
fn acls_as_on_the_backing_file_system(tag: &str, init_args: &[&str]) {
    let t = Setup::new(tag, init_args);
    let x = t.other.name.clone();

    let (owner, other) = t.acl_behaviour(&t.plain);
    // What ext4 gives: the mode follows the ACL's mask at once; the default ACL, not the
    // umask (077), shapes what is made below it; the umask (027) where there is none.
    let modes: Vec<&str> = owner.lines().take(7).collect();
    assert_eq!(
        modes,
        [
            "fresh before 600",
            "fresh after 660",
            "inherit/f 664",
            "inherit/d 775",
            "inherit/ro 555",
            "masked/f 640",
            "masked/d 750",
        ],
        "plain: {owner}"
    );
    assert!(
        owner.contains(&format!("user:{x}:rwx\t#effective:rw-")),
        "plain: {owner}"
    );
    // Denied by a named entry on a 0644 file, granted by one on a 0600 file, and granted
    // by the entry a file and a directory inherited.
    assert_eq!(
        other,
        "cat: open: Permission denied\nopen: denied\nshared\ninherit/f: written\n\
         inherit/d: written\n",
        "plain"
    );

    t.mount("-o allow_other");
    let (m_owner, m_other) = t.acl_behaviour(&t.mnt);
    // As the owner, then as the other user.
    assert_eq!((m_owner, m_other), (owner, other), "through the mount");
    let (rc, out) = t.owner.sh(&format!("{} unmount {}", s(&t.bin), s(&t.mnt)));
    assert_eq!(rc, 0, "{out}");
}

#[test]
fn posix_acls_deny_grant_inherit_and_show_at_once() {
    acls_as_on_the_backing_file_system("d", &[]);
}

#[test]
fn posix_acls_on_an_xts_volume() {
    acls_as_on_the_backing_file_system("t", &["--cipher", "aes-256-xts"]);
}

/// A mount only its owner reaches (no allow_other) leaves permission checks to the backing
/// file system, as the daemon runs as the owner, and the kernel checks nothing itself (the
/// cost of default_permissions is paid only where other users come in); the owner still gets
/// what ext4 gives: the default ACL or the umask on new entries, the mode a `setfacl`
/// changes at once.
#[test]
fn a_private_mount_gives_its_owner_what_ext4_gives() {
    let t = Setup::new("p", &[]);
    let (owner, _) = t.acl_behaviour(&t.plain);
    assert!(
        owner.starts_with("fresh before 600\nfresh after 660\n"),
        "plain: {owner}"
    );
    t.mount("");
    let (m_owner, m_other) = t.acl_behaviour(&t.mnt);
    assert_eq!(m_owner, owner, "through the mount");
    assert!(
        m_other.contains("can't cd"),
        "the other user reached the mount: {m_other}"
    );
    let line = mounted_line(&t.mnt);
    assert!(!line.contains("default_permissions"), "{line}");
    let (rc, out) = t.owner.sh(&format!("{} unmount {}", s(&t.bin), s(&t.mnt)));
    assert_eq!(rc, 0, "{out}");
}

/// The mount's line in /proc/self/mountinfo (with its options).
fn mounted_line(mnt: &Path) -> String {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(s(mnt)))
        .map(str::to_string)
        .unwrap_or_default()
}

/// xfstests generic/375's steps in `dir`, run by root for a file (`f`) and a directory (`d`)
/// the owner makes there (group: the owner's): set-gid survives a chmod and a setfacl by the
/// owner while in the file's group, and goes with each by the owner outside it (the other
/// user's group alone, no CAP_FSETID); another user's chmod fails. What `stat` shows right
/// after each.
fn set_gid_steps(t: &Setup, dir: &Path) -> String {
    let as_ids = |uid: u32, gid: u32| format!("setpriv --reuid={uid} --regid={gid} --clear-groups");
    let script = format!(
        "cd {dir} && {own} touch f && {own} mkdir d && for t in f d; do \
         echo '*** SGID should remain set (twice)'; \
         chmod 2755 $t; {own} chmod 2777 $t; stat -c %A $t; \
         chmod 2755 $t; {own} setfacl -m u::rwx,g::rwx,o::rwx $t; stat -c %A $t; \
         echo '*** SGID should be cleared (twice)'; \
         chmod 2755 $t; {outside} chmod 2777 $t; stat -c %A $t; \
         chmod 2755 $t; {outside} setfacl -m u::rwx,g::rwx,o::rwx $t; stat -c %A $t; \
         echo '*** Expected failure'; {other} chmod 2777 $t; \
         done",
        dir = s(dir),
        own = as_ids(t.owner.uid, t.owner.gid),
        outside = as_ids(t.owner.uid, t.other.gid),
        other = as_ids(t.other.uid, t.other.gid),
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &format!("exec 2>&1; {script}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn setfacl_by_an_owner_outside_the_group_clears_set_gid() {
    // xfstests generic/375: the kernel checks the caller's groups and CAP_FSETID and asks the
    // daemon to clear set-gid (FUSE_SETXATTR_ACL_KILL_SGID); the backing file system, which
    // judges by the daemon, would keep it.
    let t = Setup::new("g", &[]);
    let plain = set_gid_steps(&t, &t.plain);
    let expected: String = [("f", "-"), ("d", "d")]
        .iter()
        .map(|(name, kind)| {
            format!(
                "*** SGID should remain set (twice)\n{kind}rwxrwsrwx\n{kind}rwxrwsrwx\n\
                 *** SGID should be cleared (twice)\n{kind}rwxrwxrwx\n{kind}rwxrwxrwx\n\
                 *** Expected failure\n\
                 chmod: changing permissions of '{name}': Operation not permitted\n"
            )
        })
        .collect();
    assert_eq!(plain, expected, "plain (ext4)");
    t.mount("-o allow_other");
    assert_eq!(set_gid_steps(&t, &t.mnt), plain, "through the mount");
    let (rc, out) = t.owner.sh(&format!("{} unmount {}", s(&t.bin), s(&t.mnt)));
    assert_eq!(rc, 0, "{out}");
}
