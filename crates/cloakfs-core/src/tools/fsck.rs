//! Checking (and carefully repairing) a whole volume offline.
//!
//! [`check`] reads everything a reader would: the config (parsed strictly and MAC-verified at
//! unlock; here also each slot's fields), every directory's `cloakfs.dirid`, every name (which
//! must decrypt in its directory and be in its one canonical stored form), every long-name entry
//! and sidecar, every file header and every block tag, every symlink target and every `user.`
//! xattr name and value; and it notes the files cloakfs leaves behind when interrupted.
//!
//! With [`Options::repair`] it fixes only what can be fixed without losing or guessing anything:
//! it deletes orphaned long-name sidecars (an encrypted name without its entry), stray temporary
//! files of an interrupted config write or rekey (copies, the originals are intact) and a stray
//! `cloakfs.dirid` in the root, and gives an *empty* directory without a valid `cloakfs.dirid`
//! a new one. It never deletes or rewrites anything that holds user data.

use crate::error::{Error, Result};
use crate::tools::blocks::{BlockReader, CHUNK_BLOCKS};
use crate::tools::paths::create_dir_id;
use crate::tools::walk::{
    display_plain, BadKind, Entry, EntryType, Internal, InternalKind, Item, Progress, Walker,
    CONFIG_TEMP_PREFIX,
};
use crate::volume::Volume;
use serde::{Serialize, Serializer};
use std::collections::HashSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Most blocks failing authentication in one file that are looked at for a shorter block
/// sealed at their start (see `ContentFile::mend_blocks`).
const MEND_AT_MOST: usize = 64;

/// What kind of problem was found (the `kind` member of the JSON report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// A config field or key slot is malformed.
    Config,
    /// A directory has no `cloakfs.dirid`.
    DiridMissing,
    /// A directory's `cloakfs.dirid` is not 16 bytes or unreadable.
    DiridInvalid,
    /// A name does not decrypt in its directory, or is not in its canonical stored form.
    Name,
    /// A long-name entry whose sidecar is missing or does not match.
    LongName,
    /// A long-name sidecar without its entry.
    OrphanSidecar,
    /// A file header is truncated or of an unknown version.
    Header,
    /// A backing file is cut inside its last block.
    Truncated,
    /// One or more blocks fail authentication.
    Block,
    /// Bytes of a file that never reached the disk: its header or blocks read as zeros that a
    /// crash left where unsynced data was to be (the backing file system kept the length
    /// but not the data). Repairable on a sparse volume: they become plaintext zeros, which
    /// is all the disk holds of them.
    Unwritten,
    /// A symlink target does not decrypt.
    Symlink,
    /// A long symlink target that no symlink points to (left by an interrupted create,
    /// unlink or rekey).
    OrphanLongTarget,
    /// A `user.` xattr name or value does not decrypt.
    Xattr,
    /// A temporary file of an interrupted config write or rekey.
    StrayTemp,
    /// A directory with several IDs: a sync client's copy of its `cloakfs.dirid` beside it
    /// (two devices made it with different IDs); repaired by merging the entries under one.
    DirIdConflict,
    /// A reserved `cloakfs.` name where it does not belong, or unknown to this version.
    StrayReserved,
    /// A file cloakfs never makes (a name with a `.`): hidden from the plaintext view.
    Foreign,
    /// A sync client's conflict copy of an entry, listed under a readable name: the user's
    /// to resolve (rename over the original or remove); never repaired.
    ConflictCopy,
    /// An entry that cannot be read at all (permissions, I/O error).
    Io,
}

fn lossy<S: Serializer>(p: &Path, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

fn lossy_opt<S: Serializer>(p: &Option<PathBuf>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match p {
        Some(p) => s.serialize_str(&display_plain(p)),
        None => s.serialize_none(),
    }
}

/// One problem.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// What kind.
    pub kind: ProblemKind,
    /// The backing entry.
    #[serde(serialize_with = "lossy")]
    pub backing: PathBuf,
    /// Its plaintext path (`/` + path relative to the volume root) when its name decrypts.
    #[serde(serialize_with = "lossy_opt")]
    pub plain: Option<PathBuf>,
    /// The plaintext directory it is in (for entries whose own name is unknown).
    #[serde(serialize_with = "lossy_opt")]
    pub plain_dir: Option<PathBuf>,
    /// One-line detail.
    pub detail: String,
    /// Whether `--repair` can fix it.
    pub repairable: bool,
    /// Whether it was fixed in this run.
    pub repaired: bool,
}

impl Problem {
    /// Where it is, for people: the plaintext path if known, else the backing name in its
    /// plaintext directory, else the backing path.
    pub fn location(&self) -> String {
        if let Some(p) = &self.plain {
            return display_plain(p);
        }
        let name = self
            .backing
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match &self.plain_dir {
            Some(d) => format!("{name} in {}", display_plain(d)),
            None => self.backing.display().to_string(),
        }
    }
}

/// What was looked at.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// Directories (including the root).
    pub directories: u64,
    /// Regular files (names; hard links count once per name).
    pub files: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// Fifos, sockets and devices.
    pub other: u64,
    /// Plaintext bytes of all files (hard-linked files once).
    pub plain_bytes: u64,
    /// Backing bytes read.
    pub backing_bytes: u64,
    /// Blocks authenticated or found to be holes.
    pub blocks: u64,
    /// `user.` xattrs checked.
    pub xattrs: u64,
    /// Key slots in the config.
    pub slots: u64,
    /// Files of a sharing volume whose header is well formed but has no entry for the
    /// identity fsck runs as: their list and blocks could not be authenticated.
    pub not_shared: u64,
    /// Problems found.
    pub problems: u64,
    /// Problems repaired.
    pub repaired: u64,
}

/// The result of a check.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Whether the volume was found without any problem.
    pub clean: bool,
    /// What was looked at.
    pub counts: Counts,
    /// Every problem, in the order found.
    pub problems: Vec<Problem>,
    /// Why file contents were not checked (a suite without integrity), if they were not.
    pub contents_unchecked: Option<String>,
    /// In an adopted tree: the plaintext files not yet encrypted (plaintext paths).
    pub plaintext: Vec<std::path::PathBuf>,
    /// On a sharing volume: who can open what, by the keys the key slots keep.
    pub sharing: Option<SharingReport>,
}

/// Who can open the files of a sharing volume, as far as the key slots tell: a recipient slot
/// keeps its public keys (`recipient_keys`, FORMAT.md 5.5), so a file's entries can be told
/// apart into members' keys and others. Findings, not problems: sharing a file with someone
/// outside the volume is allowed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SharingReport {
    /// Public keys the recipient slots keep (short forms).
    pub member_keys: Vec<String>,
    /// Recipient slots that keep no public keys (made by an earlier cloakfs): their members'
    /// keys count as unknown below.
    pub slots_without_keys: Vec<u32>,
    /// Files (plaintext paths, `/...`) with no entry for any member key: no member can open
    /// them.
    pub no_member_can_open: Vec<String>,
    /// Entries for keys no slot keeps, as (file, key).
    pub unknown_keys: Vec<(String, String)>,
    /// Directories with default recipients (FORMAT.md 18.5), as (directory, keys): any member
    /// may set them, so each is shown.
    pub defaults: Vec<(String, Vec<String>)>,
}

impl Report {
    /// Problems left after repairs.
    pub fn unrepaired(&self) -> usize {
        self.problems.iter().filter(|p| !p.repaired).count()
    }
}

/// What to do besides checking.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Fix what is safely fixable.
    pub repair: bool,
}

struct Checker<'a> {
    volume: &'a Volume,
    opts: Options,
    report: Report,
    seen_inodes: HashSet<(u64, u64)>,
    progress: &'a dyn Progress,
    out: Vec<u8>,
    sealed: Vec<u8>,
    /// The cipher directory (long symlink targets live in its root).
    cipherdir: PathBuf,
    /// Long symlink targets that symlinks point to.
    long_targets_used: HashSet<String>,
    /// Directories with several IDs to merge after the walk, parents first: (problem,
    /// plaintext path; its backing path may change as its parent is merged).
    merges: Vec<(usize, PathBuf)>,
}

/// The member keys the recipient and gpg slots of a sharing volume keep.
fn sharing_members(volume: &Volume) -> SharingReport {
    let mut r = SharingReport::default();
    for slot in volume.config().slots() {
        if ![crate::slots::kind::RECIPIENT, crate::slots::kind::GPG].contains(&slot.kind()) {
            continue;
        }
        match crate::slots::recipient::slot_keys(slot) {
            Some(keys) => r.member_keys.extend(keys),
            None => r.slots_without_keys.push(slot.id()),
        }
    }
    r
}

/// Checks the volume at `cipherdir` (see the module documentation). The volume must not be in
/// the middle of a rekey ([`crate::tools::rekey::check_not_rekeying`]).
pub fn check(
    volume: &Volume,
    cipherdir: &Path,
    opts: Options,
    progress: &dyn Progress,
) -> Result<Report> {
    crate::tools::rekey::check_not_rekeying(cipherdir)?;
    let (bytes, entries) = crate::tools::walk::totals(cipherdir);
    progress.start(bytes, entries);
    let mut c = Checker {
        volume,
        opts,
        report: Report {
            contents_unchecked: volume
                .content()
                .suite()
                .integrity_warning()
                .map(str::to_owned),
            ..Report::default()
        },
        seen_inodes: HashSet::new(),
        merges: Vec::new(),
        progress,
        out: Vec::new(),
        sealed: Vec::new(),
        cipherdir: cipherdir.to_path_buf(),
        long_targets_used: HashSet::new(),
    };
    c.config(cipherdir);
    if volume.is_sharing() {
        c.report.sharing = Some(sharing_members(volume));
    }
    for item in Walker::new(volume, cipherdir) {
        match item {
            Item::Entry(e) => {
                c.progress.advance(0, u64::from(!e.is_root()));
                c.conflict_copy(&e);
                match e.kind {
                    EntryType::Dir => {
                        c.report.counts.directories += 1;
                        c.defaults(&e.backing, &e.plain);
                    }
                    EntryType::File => {
                        c.report.counts.files += 1;
                        if e.meta.nlink() > 1 && !c.seen_inodes.insert((e.meta.dev(), e.meta.ino()))
                        {
                            continue; // another name of a file already checked
                        }
                        c.file(&e.backing, &e.plain, &e.meta);
                    }
                    EntryType::Symlink => {
                        c.report.counts.symlinks += 1;
                        c.symlink(&e.backing, &e.plain);
                    }
                    _ => c.report.counts.other += 1,
                }
                c.xattrs(&e.backing, &e.plain);
            }
            Item::Internal(i) => c.internal(&i),
            Item::Bad(b) => c.bad(b),
        }
    }
    c.long_targets(cipherdir);
    c.merge_dir_ids(cipherdir);
    let r = &mut c.report;
    r.counts.problems = r.problems.len() as u64;
    r.counts.repaired = r.problems.iter().filter(|p| p.repaired).count() as u64;
    r.clean = r.problems.is_empty();
    Ok(c.report)
}

/// The ID derived for backing directory `dir` (plaintext path `plain`) from its parent's ID
/// and its name (FORMAT.md 9.2); None for the root or where the parent's ID cannot be read.
fn derived_dir_id(
    volume: &Volume,
    cipherdir: &Path,
    dir: &Path,
    plain: &Path,
) -> Option<crate::format::names::DirId> {
    let name = plain.file_name()?;
    let parent = crate::tools::paths::read_dir_id(volume, cipherdir, dir.parent()?).ok()?;
    Some(volume.derived_dir_id(&parent, std::os::unix::ffi::OsStrExt::as_bytes(name)))
}

impl Checker<'_> {
    /// Merges each directory found with several IDs (`--repair`), once the walk is done.
    fn merge_dir_ids(&mut self, cipherdir: &Path) {
        for (p, plain) in std::mem::take(&mut self.merges) {
            let volume = self.volume;
            self.repair(p, || {
                let other = |e: Error| std::io::Error::other(e.to_string());
                let dir = crate::tools::translate::lookup(volume, cipherdir, &plain, false)
                    .map_err(other)?;
                let main =
                    crate::tools::paths::read_dir_id(volume, cipherdir, &dir).map_err(other)?;
                let target = derived_dir_id(volume, cipherdir, &dir, &plain).unwrap_or(main);
                crate::tools::dir_id_merge::merge(volume, &dir, &main, &target).map(|_| ())
            });
        }
    }

    fn push(
        &mut self,
        kind: ProblemKind,
        backing: &Path,
        plain: Option<&Path>,
        plain_dir: Option<&Path>,
        detail: String,
        repairable: bool,
    ) -> usize {
        self.report.problems.push(Problem {
            kind,
            backing: backing.to_path_buf(),
            plain: plain.map(Path::to_path_buf),
            plain_dir: plain_dir.map(Path::to_path_buf),
            detail,
            repairable,
            repaired: false,
        });
        self.report.problems.len() - 1
    }

    /// Runs `fix` for problem `i` when repairing; records the outcome.
    fn repair(&mut self, i: usize, fix: impl FnOnce() -> std::io::Result<()>) {
        if !self.opts.repair || !self.report.problems[i].repairable {
            return;
        }
        match fix() {
            Ok(()) => self.report.problems[i].repaired = true,
            Err(e) => {
                let p = &mut self.report.problems[i];
                p.detail.push_str(&format!(" (repair failed: {e})"));
            }
        }
    }

    /// Sorts the entries of a sharing volume's file into members' keys and others. The list
    /// is read as it stands (its authenticity is checked when the file is opened, below, by
    /// whoever holds an entry); a list that does not parse is left to that check.
    fn recipients(&mut self, file: &std::fs::File, plain: &Path, len: u64) {
        let Ok(Some(bytes)) = crate::io::header::read(self.volume.content(), file, len) else {
            return;
        };
        let Ok(header) = crate::format::filekey::SharedHeader::parse(&bytes) else {
            return;
        };
        let Some(sh) = self.report.sharing.as_mut() else {
            return;
        };
        let mut opens = false;
        for g in &header.grants {
            let key = crate::slots::recipient::short_key(&g.recipient);
            if sh.member_keys.contains(&key) {
                opens = true;
            } else {
                sh.unknown_keys.push((display_plain(plain), key));
            }
        }
        if !opens {
            sh.no_member_can_open.push(display_plain(plain));
        }
    }

    /// Notes the default recipients of directory `backing`, if any.
    fn defaults(&mut self, backing: &Path, plain: &Path) {
        let Some(sh) = self.report.sharing.as_mut() else {
            return;
        };
        match crate::tools::share::read_default(self.volume, backing) {
            Ok(keys) if keys.is_empty() => {}
            Ok(keys) => sh.defaults.push((display_plain(plain), keys)),
            Err(e) => {
                let e = format!("default recipients: {e}");
                self.push(ProblemKind::Xattr, backing, Some(plain), None, e, false);
            }
        }
    }

    fn config(&mut self, cipherdir: &Path) {
        let cfg = self.volume.config();
        self.report.counts.slots = cfg.slots().len() as u64;
        let path = crate::format::config::config_path(cipherdir);
        match crate::format::config::VolumeConfig::load(cipherdir) {
            Ok(disk) if &disk == cfg => {}
            Ok(_) => {
                self.push(
                    ProblemKind::Config,
                    &path,
                    None,
                    None,
                    "the config changed on disk while it was checked".into(),
                    false,
                );
            }
            Err(e) => {
                self.push(ProblemKind::Config, &path, None, None, e.to_string(), false);
            }
        }
        self.plaintext_list(cipherdir);
        for slot in cfg.slots() {
            let f = slot.fields();
            let mut bad = Vec::new();
            if slot.label().contains(['\n', '\0']) {
                bad.push("label has a line feed or NUL".to_string());
            }
            // A kind this version does not know is kept as it is (a newer cloakfs made it).
            if slot.is_known_kind() {
                match f.get("wrapped") {
                    Some(w) if crate::text::unb64_array::<60>(w).is_some() => {}
                    Some(_) => bad.push("wrapped key is not 60 base64url bytes".into()),
                    None => bad.push("no wrapped key".into()),
                }
                for k in crate::slots::kind_fields(slot.kind()).unwrap_or(&[]) {
                    if !f.contains_key(*k) {
                        bad.push(format!("{} slot without its field {k:?}", slot.kind()));
                    }
                }
            }
            if slot.kind() == crate::format::config::kind::PASSPHRASE {
                if let Err(e) = slot.argon2() {
                    bad.push(e.to_string());
                }
                match f.get("salt") {
                    Some(s) if crate::text::unb64_array::<32>(s).is_some() => {}
                    _ => bad.push("salt is not 32 base64url bytes".into()),
                }
            }
            for b in bad {
                self.push(
                    ProblemKind::Config,
                    &path,
                    None,
                    None,
                    format!("key slot {}: {b}", slot.id()),
                    false,
                );
            }
        }
    }

    fn file(&mut self, backing: &Path, plain: &Path, meta: &std::fs::Metadata) {
        let file = match std::fs::File::open(backing) {
            Ok(f) if self.report.sharing.is_some() => {
                self.recipients(&f, plain, meta.len());
                f
            }
            Ok(f) => f,
            Err(e) => {
                self.push(
                    ProblemKind::Io,
                    backing,
                    Some(plain),
                    None,
                    e.to_string(),
                    false,
                );
                return;
            }
        };
        let r = match BlockReader::open(self.volume.content(), file) {
            Ok(r) => r,
            Err(Error::AccessDenied(_)) => {
                self.report.counts.not_shared += 1;
                self.progress.advance(meta.len(), 0);
                return;
            }
            Err(e) => {
                self.progress.advance(meta.len(), 0);
                if !matches!(e, Error::Io(_)) && self.unwritten(backing, 0, meta.len()) {
                    let size = self
                        .volume
                        .content()
                        .layout()
                        .plain_size_lenient(meta.len());
                    let p = self.push(
                        ProblemKind::Unwritten,
                        backing,
                        Some(plain),
                        None,
                        format!(
                            "all {} bytes are zeros (the data never reached the disk before a \
                             crash): {e}",
                            meta.len()
                        ),
                        !self.volume.content().strict_holes(),
                    );
                    let codec = self.volume.content().clone();
                    let backing = backing.to_path_buf();
                    self.repair(p, || {
                        // A new header, and zeros of the same plaintext size.
                        let f = std::fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .open(&backing)?;
                        f.set_len(0)?;
                        let cf = crate::io::file::ContentFile::open(codec, f)
                            .map_err(std::io::Error::other)?;
                        cf.truncate(size).map_err(std::io::Error::other)?;
                        cf.sync(false).map_err(std::io::Error::other)
                    });
                    return;
                }
                let kind = match e {
                    Error::Io(_) => ProblemKind::Io,
                    _ => ProblemKind::Header,
                };
                self.push(kind, backing, Some(plain), None, e.to_string(), false);
                return;
            }
        };
        self.report.counts.plain_bytes += r.size();
        if !self.volume.content().suite().authenticated() {
            // Nothing to check: without tags every ciphertext decrypts to something.
            self.progress.advance(meta.len(), 0);
            return;
        }
        let mut failed: Vec<u64> = Vec::new();
        let mut first = 0;
        let count = r.block_count();
        while first < count {
            let chunk = match r.read_chunk(first, CHUNK_BLOCKS, &mut self.out, &mut self.sealed) {
                Ok(c) => c,
                Err(e) => {
                    self.push(
                        ProblemKind::Io,
                        backing,
                        Some(plain),
                        None,
                        e.to_string(),
                        false,
                    );
                    break;
                }
            };
            let n = chunk.states.len() as u64;
            failed.extend(chunk.failures());
            self.report.counts.blocks += n;
            self.report.counts.backing_bytes += self.sealed.len() as u64;
            self.progress.advance(self.sealed.len() as u64, 0);
            first += n;
        }
        self.progress
            .advance(r.layout().header_len().min(r.backing_len()), 0);
        let layout = r.layout();
        let (zeros, failed): (Vec<u64>, Vec<u64>) = failed.into_iter().partition(|&b| {
            let at = layout.cipher_offset(b);
            let len = layout.block_len(b, r.size()) + layout.overhead();
            self.unwritten(backing, at, len)
        });
        if !zeros.is_empty() {
            let p = self.push(
                ProblemKind::Unwritten,
                backing,
                Some(plain),
                None,
                format!(
                    "{} blocks are all zeros (their data never reached the disk before a crash; \
                     first: block {})",
                    zeros.len(),
                    zeros[0]
                ),
                !self.volume.content().strict_holes(),
            );
            let codec = self.volume.content().clone();
            let size = r.size();
            let backing = backing.to_path_buf();
            self.repair(p, || {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&backing)?;
                let cf =
                    crate::io::file::ContentFile::open(codec, f).map_err(std::io::Error::other)?;
                for b in zeros {
                    let len = layout.block_len(b, size) as usize;
                    cf.write_at(layout.plain_offset(b), &vec![0u8; len])
                        .map_err(std::io::Error::other)?;
                }
                cf.sync(false).map_err(std::io::Error::other)
            });
        }
        if !failed.is_empty() {
            let shown: Vec<String> = failed.iter().take(10).map(u64::to_string).collect();
            let more = if failed.len() > 10 { ", ..." } else { "" };
            // Blocks that clients writing the file at once without locks (sshfs) left as a
            // shorter block sealed at their start and other bytes after it can be mended.
            let open = |write: bool| {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(write)
                    .open(backing)?;
                crate::io::file::ContentFile::open(self.volume.content().clone(), f)
                    .map_err(std::io::Error::other)
            };
            // Each costs up to a few ms to look at: a file damaged in many blocks is not
            // what a race leaves.
            let torn = if failed.len() <= MEND_AT_MOST {
                open(false)
                    .and_then(|cf| {
                        cf.mend_blocks(&failed, false)
                            .map_err(std::io::Error::other)
                    })
                    .unwrap_or(0)
            } else {
                0
            };
            let mendable = torn == failed.len();
            let detail = if mendable {
                format!(
                    "{} of {} blocks fail authentication (block {}{more}), each holding a shorter \
                     block sealed at its start: left by clients writing the file at once on a \
                     store without locks (sshfs); repair seals each again as that block's bytes \
                     followed by zeros",
                    failed.len(),
                    count,
                    shown.join(", "),
                )
            } else {
                format!(
                    "{} of {} blocks fail authentication (block {}{more}): tampered, or damaged \
                     storage",
                    failed.len(),
                    count,
                    shown.join(", "),
                )
            };
            let p = self.push(
                ProblemKind::Block,
                backing,
                Some(plain),
                None,
                detail,
                mendable,
            );
            self.repair(p, || {
                open(true)?
                    .mend_blocks(&failed, true)
                    .map_err(std::io::Error::other)
                    .map(drop)
            });
        }
        if let Some(d) = r.damage() {
            let tail = r.backing_len() - r.layout().cipher_size(r.size());
            self.progress.advance(tail, 0);
            self.push(ProblemKind::Truncated, backing, Some(plain), None, d, false);
        }
    }

    /// Whether the `len` bytes at `at` of `backing` are all zeros (and there are some).
    fn unwritten(&self, backing: &Path, at: u64, len: u64) -> bool {
        use std::os::unix::fs::FileExt;
        let Ok(f) = std::fs::File::open(backing) else {
            return false;
        };
        let mut buf = vec![0u8; (len as usize).min(1 << 20)];
        let mut pos = at;
        while pos < at + len {
            let n = ((at + len - pos) as usize).min(buf.len());
            if f.read_exact_at(&mut buf[..n], pos).is_err() || buf[..n].iter().any(|&b| b != 0) {
                return false;
            }
            pos += n as u64;
        }
        len > 0
    }

    fn symlink(&mut self, backing: &Path, plain: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let res = std::fs::read_link(backing)
            .map_err(Error::from)
            .and_then(|t| {
                let t = t.as_os_str().as_bytes();
                if let Some(name) = crate::format::meta::long_target_name(t) {
                    self.long_targets_used.insert(name.to_string());
                }
                let root = std::fs::File::open(&self.cipherdir)?;
                crate::io::long_targets::read_target(
                    self.volume.meta(),
                    std::os::fd::AsFd::as_fd(&root),
                    t,
                )
            });
        if let Err(e) = res {
            self.push(
                ProblemKind::Symlink,
                backing,
                Some(plain),
                None,
                e.to_string(),
                false,
            );
        }
    }

    fn xattrs(&mut self, backing: &Path, plain: &Path) {
        let names = match crate::io::xattrs::list(backing) {
            Ok(n) => n,
            Err(e) => {
                self.push(
                    ProblemKind::Io,
                    backing,
                    Some(plain),
                    None,
                    format!("cannot list xattrs: {e}"),
                    false,
                );
                return;
            }
        };
        let suite = self.volume.content().suite();
        for stored in names
            .iter()
            .filter(|n| crate::io::xattrs::is_user(n) && !suite.is_header_xattr(n))
        {
            self.report.counts.xattrs += 1;
            let shown = String::from_utf8_lossy(stored).into_owned();
            let name = match self.volume.meta().decrypt_xattr_name(stored) {
                Ok(n) => String::from_utf8_lossy(&n).into_owned(),
                Err(_) => {
                    self.push(
                        ProblemKind::Xattr,
                        backing,
                        Some(plain),
                        None,
                        format!("xattr name {shown} does not decrypt"),
                        false,
                    );
                    continue;
                }
            };
            let res = crate::io::xattrs::get(backing, stored)
                .map_err(Error::from)
                .and_then(|v| self.volume.meta().decrypt_xattr_value(stored, &v));
            if let Err(e) = res {
                self.push(
                    ProblemKind::Xattr,
                    backing,
                    Some(plain),
                    None,
                    format!("value of xattr {name}: {e}"),
                    false,
                );
            }
        }
    }

    /// Every file of the long-target directory must be the target of a symlink met in the
    /// walk; one that is not is left by an interrupted create, unlink or rekey (repairable:
    /// nothing points to it).
    fn long_targets(&mut self, cipherdir: &Path) {
        let dir = cipherdir.join(crate::format::meta::LONG_TARGETS_DIR);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        let mut names: Vec<_> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        names.sort();
        for name in names {
            let backing = dir.join(&name);
            let n = name.to_string_lossy().into_owned();
            // What a symlink pointing to it holds.
            let stored = format!("{}{n}", crate::format::meta::LONG_TARGET_PREFIX);
            let known = name.to_str().is_some()
                && crate::format::meta::long_target_name(stored.as_bytes()).is_some();
            if !known {
                self.push(
                    ProblemKind::Foreign,
                    &backing,
                    None,
                    None,
                    "not a long symlink target (a name cloakfs never makes there)".into(),
                    false,
                );
            } else if !self
                .long_targets_used
                .contains(name.to_str().unwrap_or_default())
            {
                if crate::io::long_targets::read_target_at(
                    self.volume.meta(),
                    cipherdir,
                    stored.as_bytes(),
                )
                .is_err()
                {
                    // Not a target any symlink could read (damaged, or a copy under another
                    // file's name): no data of anyone's is lost by removing it.
                    let p = self.push(
                        ProblemKind::OrphanLongTarget,
                        &backing,
                        None,
                        None,
                        "long symlink target that no symlink points to and that does not open \
                         under its name (damaged, or a copy of another): repair removes it"
                            .into(),
                        true,
                    );
                    self.repair(p, || std::fs::remove_file(&backing));
                    continue;
                }
                // It may be the last remnant of a symlink a sync client replaced with
                // another device's version: repair gives it a symlink again, never deletes it.
                let restored = format!("lost symlink {}", &n[..8.min(n.len())]);
                let p = self.push(
                    ProblemKind::OrphanLongTarget,
                    &backing,
                    None,
                    None,
                    format!(
                        "long symlink target that no symlink points to (left by an interrupted \
                         create, unlink or rekey, or by a sync client that replaced its \
                         symlink); repair restores it as symlink /{restored}"
                    ),
                    true,
                );
                let volume = self.volume;
                let target = stored;
                self.repair(p, || {
                    let root_id = volume.root_dir_id();
                    let stored = volume
                        .names()
                        .encrypt(&root_id, restored.as_bytes())
                        .map_err(std::io::Error::other)?;
                    std::os::unix::fs::symlink(&target, cipherdir.join(stored.backing()))
                });
            }
        }
    }

    /// Reports entry `e` if it is a conflict copy, by the plaintext path of its original (it
    /// is then checked as the entry it is: its data is the user's).
    fn conflict_copy(&mut self, e: &Entry) {
        if let Some((copy, original)) = e.conflict.as_deref() {
            self.push(
                ProblemKind::ConflictCopy,
                &e.backing,
                Some(&e.plain),
                None,
                format!(
                    "conflict copy of {} ({}); resolve by renaming it over that name or \
                     removing it",
                    display_plain(original),
                    copy.describe()
                ),
                false,
            );
        }
    }

    /// Reports an adopted tree that serves no plaintext entry because its manifest is
    /// unusable, and one adopted before manifests, which serves every plaintext entry.
    fn plaintext_list(&mut self, cipherdir: &Path) {
        let p = &self.volume.config().params;
        if !p.adopted {
            return;
        }
        self.volume.keep_plaintext_list(cipherdir);
        let manifest = cipherdir.join(crate::io::plain_list::MANIFEST_FILE);
        let detail = if !p.listed {
            "this adopted tree has no manifest of its plaintext entries, so a plaintext file \
             put into the cipher directory is shown as one of yours: run `cloakfs upgrade`"
                .to_string()
        } else if let Some(problem) = self.volume.plaintext_list_problem() {
            format!(
                "{problem}: no plaintext entry is shown (mount with --accept-plaintext to see \
                 them all, and check them)"
            )
        } else {
            return;
        };
        self.push(ProblemKind::Config, &manifest, None, None, detail, false);
    }

    fn internal(&mut self, i: &Internal) {
        let dir = Some(i.dir_plain.as_path());
        let name = i
            .backing
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let backing = i.backing.clone();
        match i.kind {
            InternalKind::Config
            | InternalKind::DirId
            | InternalKind::Sidecar
            | InternalKind::SidecarConflictCopy
            | InternalKind::LongTargets
            | InternalKind::PlaintextList
            | InternalKind::RetiredIds => {}
            InternalKind::PlaintextUnlisted => {
                self.push(
                    ProblemKind::Foreign,
                    &i.backing,
                    None,
                    dir,
                    "plaintext entry that the adopted tree's manifest does not list (put there \
                     after the adoption, or under the name of an entry encrypted or removed \
                     since): not shown; look at it, then move it out or remove it"
                        .into(),
                    false,
                );
            }
            InternalKind::Plaintext => {
                let plain = i.dir_plain.join(&name);
                let is_file = i.backing.symlink_metadata().is_ok_and(|m| m.is_file());
                if is_file {
                    self.report.plaintext.push(plain);
                }
            }
            InternalKind::PlaintextShadowed => {
                self.push(
                    ProblemKind::Foreign,
                    &i.backing,
                    None,
                    dir,
                    "plaintext entry hidden by the encrypted entry of the same name (made \
                     outside the mount, or left by an interrupted cloakfs encrypt: run it again)"
                        .into(),
                    false,
                );
            }
            InternalKind::OrphanSidecar => {
                let p = self.push(
                    ProblemKind::OrphanSidecar,
                    &i.backing,
                    None,
                    dir,
                    "long-name sidecar without its entry (left by an interrupted create or rename)"
                        .into(),
                    true,
                );
                self.repair(p, || std::fs::remove_file(&backing));
            }
            InternalKind::ConfigTemp => {
                let pid = name
                    .strip_prefix(CONFIG_TEMP_PREFIX)
                    .and_then(|p| p.parse::<u32>().ok());
                let live = pid.is_some_and(|p| {
                    p != std::process::id() && Path::new(&format!("/proc/{p}")).exists()
                });
                let detail = if live {
                    format!(
                        "temporary config file of process {}, which is still running: left alone",
                        pid.unwrap_or(0)
                    )
                } else {
                    "temporary file of an interrupted config write".into()
                };
                let p = self.push(ProblemKind::StrayTemp, &i.backing, None, dir, detail, !live);
                self.repair(p, || std::fs::remove_file(&backing));
            }
            InternalKind::RekeyTemp => {
                let p = self.push(
                    ProblemKind::StrayTemp,
                    &i.backing,
                    None,
                    dir,
                    "temporary entry of an interrupted rekey (a copy; the original is intact)"
                        .into(),
                    true,
                );
                self.repair(p, || std::fs::remove_file(&backing));
            }
            InternalKind::MkdirTemp
                if i.backing.symlink_metadata().is_ok_and(|m| {
                    m.is_file() && m.len() <= self.volume.content().layout().header_len()
                }) =>
            {
                // A shared-storage create writes a new file's header into
                // `cloakfs.tmp.new.<hex>` and links it under its name: nothing but a header.
                let p = self.push(
                    ProblemKind::StrayTemp,
                    &i.backing,
                    None,
                    dir,
                    "file left by an interrupted create (it holds a header only)".into(),
                    true,
                );
                self.repair(p, || std::fs::remove_file(&backing));
            }
            InternalKind::MkdirTemp => {
                // Holds at most the ID written before the rename that publishes it.
                let only_id = std::fs::read_dir(&i.backing).is_ok_and(|rd| {
                    rd.flatten()
                        .all(|e| e.file_name() == crate::format::names::DIRID_FILE)
                });
                let detail = if only_id {
                    "directory left half-made by an interrupted mkdir (it holds nothing)".into()
                } else {
                    format!("reserved name {name} holds entries: left alone")
                };
                let p = self.push(
                    ProblemKind::StrayTemp,
                    &i.backing,
                    None,
                    dir,
                    detail,
                    only_id,
                );
                self.repair(p, || {
                    match std::fs::remove_file(backing.join(crate::format::names::DIRID_FILE)) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                        _ => {}
                    }
                    std::fs::remove_dir(&backing)
                });
            }
            InternalKind::RekeyJournal => {
                self.push(
                    ProblemKind::StrayReserved,
                    &i.backing,
                    None,
                    dir,
                    "rekey journal: a rekey was interrupted (cloakfs rekey --resume or --rollback)"
                        .into(),
                    false,
                );
            }
            InternalKind::StrayReserved => {
                let root_dirid =
                    name == crate::format::names::DIRID_FILE && i.dir_plain.as_os_str().is_empty();
                let detail = if root_dirid {
                    "the root directory has no cloakfs.dirid (its ID is the volume ID)".to_string()
                } else {
                    format!("reserved name {name} does not belong here (made by a newer cloakfs?)")
                };
                let p = self.push(
                    ProblemKind::StrayReserved,
                    &i.backing,
                    None,
                    dir,
                    detail,
                    root_dirid,
                );
                self.repair(p, || std::fs::remove_file(&backing));
            }
            InternalKind::DirIdCopy => {
                let p = self.push(
                    ProblemKind::DirIdConflict,
                    &i.backing,
                    dir,
                    dir,
                    format!(
                        "directory has several IDs ({name} is a sync client's copy of its \
                         {}); its entries named under either are shown, and \
                         --repair merges them under one",
                        crate::format::names::DIRID_FILE
                    ),
                    true,
                );
                // After the walk, which may still visit entries by their current names.
                self.merges.push((p, i.dir_plain.clone()));
            }
            InternalKind::Foreign => {
                self.push(
                    ProblemKind::Foreign,
                    &i.backing,
                    None,
                    dir,
                    "not made by cloakfs (a sync-tool temporary or conflict copy?); hidden from \
                     the plaintext view and left alone"
                        .into(),
                    false,
                );
            }
        }
    }

    fn bad(&mut self, b: crate::tools::walk::Bad) {
        let dir = Some(b.dir_plain.as_path());
        match b.kind {
            BadKind::DirIdMissing | BadKind::DirIdInvalid => {
                let empty = b.entries == 0;
                let kind = if b.kind == BadKind::DirIdMissing {
                    ProblemKind::DiridMissing
                } else {
                    ProblemKind::DiridInvalid
                };
                let detail = if empty {
                    format!(
                        "{} (the directory is empty: a new ID can be written)",
                        b.detail
                    )
                } else {
                    format!(
                        "{}: the names of its {} entries cannot be decrypted",
                        b.detail, b.entries
                    )
                };
                let p = self.push(kind, &b.backing, b.plain.as_deref(), None, detail, empty);
                let backing = b.backing.clone();
                // Derived, as a writer makes it, so two devices that repair write one ID.
                let new_id = b
                    .plain
                    .as_deref()
                    .and_then(|plain| derived_dir_id(self.volume, &self.cipherdir, &backing, plain))
                    .unwrap_or_else(crate::format::names::DirId::random);
                self.repair(p, || {
                    let id = backing.join(crate::format::names::DIRID_FILE);
                    match std::fs::remove_file(&id) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                        _ => {}
                    }
                    create_dir_id(&backing, new_id).map_err(|e| match e {
                        Error::Io(e) => e,
                        e => std::io::Error::other(e.to_string()),
                    })?;
                    // Read-only, as the mount makes them.
                    std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o440))
                });
            }
            BadKind::Name => {
                self.push(ProblemKind::Name, &b.backing, None, dir, b.detail, false);
            }
            BadKind::SidecarMissing | BadKind::SidecarMismatch => {
                self.push(
                    ProblemKind::LongName,
                    &b.backing,
                    None,
                    dir,
                    b.detail,
                    false,
                );
            }
            BadKind::ReadDir | BadKind::Stat => {
                self.push(
                    ProblemKind::Io,
                    &b.backing,
                    b.plain.as_deref(),
                    dir,
                    b.detail,
                    false,
                );
            }
        }
    }
}
