//! Walking a cipher directory without a mount: every backing entry, with its plaintext path
//! where its name decrypts, and a precise error where it does not.
//!
//! [`Walker`] yields the root first, then every directory's entries (sorted by backing name)
//! before the entries of its subdirectories, so a parent always comes before its children.
//! Each backing entry is one [`Item`]:
//!
//! - [`Item::Entry`]: a plaintext entry (file, directory, symlink, fifo, socket, device);
//! - [`Item::Internal`]: a file cloakfs keeps for itself or ignores (config, directory ID,
//!   long-name sidecar, temporary files, foreign files), classified by [`InternalKind`];
//! - [`Item::Bad`]: something that cannot be read: a directory without a valid
//!   `cloakfs.dirid` (its entries' names cannot be decrypted), a name that does not decrypt, a
//!   long-name entry whose sidecar is missing or does not match.
//!
//! The walker never follows symlinks and never changes anything.

use crate::error::{Error, Result};
use crate::format::config::CONFIG_FILE;
use crate::format::names::{self, DirId, DIRID_FILE, LONG_SIDECAR_SUFFIX};
use crate::tools::paths::{parse_dir_id, DIRID_LEN};
use crate::volume::Volume;
use std::collections::{BTreeSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs::Metadata;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// Prefix of the temporary files of an atomic config write (`cloakfs.conf.tmp.<pid>`).
pub const CONFIG_TEMP_PREFIX: &str = "cloakfs.conf.tmp.";
/// The rekey journal, next to the config (see [`crate::tools::rekey`]).
pub const REKEY_JOURNAL: &str = "cloakfs.rekey";
/// Prefix of the temporary entries a rekey creates in any directory.
pub const REKEY_TEMP_PREFIX: &str = "cloakfs.rekey.tmp.";
/// Prefix of a directory the mount is building (before its ID is in place and it is renamed).
pub const MKDIR_TEMP_PREFIX: &str = "cloakfs.tmp.";

/// The type of a backing (and so of a plaintext) entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryType {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
    /// Block device.
    BlockDevice,
    /// Character device.
    CharDevice,
}

impl EntryType {
    /// The type of an entry from its `lstat`.
    pub fn of(meta: &Metadata) -> Self {
        let t = meta.file_type();
        if t.is_dir() {
            EntryType::Dir
        } else if t.is_symlink() {
            EntryType::Symlink
        } else if t.is_fifo() {
            EntryType::Fifo
        } else if t.is_socket() {
            EntryType::Socket
        } else if t.is_block_device() {
            EntryType::BlockDevice
        } else if t.is_char_device() {
            EntryType::CharDevice
        } else {
            EntryType::File
        }
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            EntryType::File => "file",
            EntryType::Dir => "directory",
            EntryType::Symlink => "symlink",
            EntryType::Fifo => "fifo",
            EntryType::Socket => "socket",
            EntryType::BlockDevice => "block device",
            EntryType::CharDevice => "character device",
        }
    }
}

/// A plaintext entry found in the cipher directory.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Plaintext path relative to the volume root; empty for the root itself.
    pub plain: PathBuf,
    /// The backing entry.
    pub backing: PathBuf,
    /// Its type.
    pub kind: EntryType,
    /// `lstat` of the backing entry.
    pub meta: Metadata,
    /// Whether the name is stored as a long-name entry with a sidecar.
    pub long_name: bool,
    /// For a sync client's conflict copy (listed under its shown name): what it is, and the
    /// plaintext path of the entry it is a copy of.
    pub conflict: Option<Box<(crate::sync_folder::ConflictCopy, PathBuf)>>,
}

impl Entry {
    /// Whether this is the volume root.
    pub fn is_root(&self) -> bool {
        self.plain.as_os_str().is_empty()
    }
}

/// What an internal (never listed) backing entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InternalKind {
    /// The volume config in the root.
    Config,
    /// A directory's `cloakfs.dirid`.
    DirId,
    /// The sidecar of a long-name entry that exists.
    Sidecar,
    /// A sidecar whose long-name entry does not exist (left by a crash between the two).
    OrphanSidecar,
    /// `cloakfs.conf.tmp.<pid>`: left by an interrupted config write (or one in progress).
    ConfigTemp,
    /// The rekey journal: a rekey was interrupted.
    RekeyJournal,
    /// A temporary entry of a rekey.
    RekeyTemp,
    /// `cloakfs.tmp.<hex>`: a directory the mount was creating when it was interrupted.
    MkdirTemp,
    /// `cloakfs.symlinks` in the root: the long symlink targets (see
    /// [`crate::io::long_targets`]).
    LongTargets,
    /// `cloakfs.retired` in the root of a sharing volume: its retirement records (see
    /// [`crate::io::retired`]).
    RetiredIds,
    /// A sync client's copy of the directory's `cloakfs.dirid` (a conflict between two
    /// devices; see [`crate::tools::dir_id_merge`]): entries may be named under its ID.
    DirIdCopy,
    /// A reserved (`cloakfs.`) name that does not belong where it is, or that this version
    /// does not know.
    StrayReserved,
    /// A sync client's conflict copy of a long name's sidecar: kept (the entry's own
    /// conflict copy may need it).
    SidecarConflictCopy,
    /// A name with a `.` that cloakfs never makes (sync-tool temporaries, ...).
    Foreign,
    /// A plaintext entry of an adopted tree (not yet encrypted).
    Plaintext,
    /// A plaintext entry of an adopted tree hidden by an encrypted entry of the same name.
    PlaintextShadowed,
    /// An entry with a plaintext name in an adopted tree that its manifest does not list
    /// (FORMAT.md section 21.1): put there after the adoption, or an entry once encrypted or
    /// removed. Not served; a directory is not looked into.
    PlaintextUnlisted,
    /// An adopted tree's manifest of plaintext entries or its retired entries, in the root
    /// (see [`crate::io::plain_list`]).
    PlaintextList,
}

/// A backing entry cloakfs keeps for itself or ignores.
#[derive(Debug, Clone)]
pub struct Internal {
    /// The backing entry.
    pub backing: PathBuf,
    /// Plaintext path of the directory it is in.
    pub dir_plain: PathBuf,
    /// What it is.
    pub kind: InternalKind,
}

/// Why an entry could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadKind {
    /// The backing directory cannot be listed.
    ReadDir,
    /// The directory has no `cloakfs.dirid`: the names inside cannot be decrypted.
    DirIdMissing,
    /// The directory's `cloakfs.dirid` is unreadable or not 16 bytes.
    DirIdInvalid,
    /// An encrypted name does not decrypt in its directory (or is not in its one stored form).
    Name,
    /// A long-name entry without its sidecar.
    SidecarMissing,
    /// A long-name entry whose sidecar does not hash to the entry's name, or does not decrypt.
    SidecarMismatch,
    /// The entry vanished or cannot be `lstat`ed.
    Stat,
}

/// A backing entry that could not be read.
#[derive(Debug, Clone)]
pub struct Bad {
    /// The backing entry (the directory itself for directory-level problems).
    pub backing: PathBuf,
    /// Plaintext path of the entry if known (its name decrypted), else `None`.
    pub plain: Option<PathBuf>,
    /// Plaintext path of the directory it is in (for a directory-level problem: that of the
    /// directory itself).
    pub dir_plain: PathBuf,
    /// What is wrong.
    pub kind: BadKind,
    /// One-line detail.
    pub detail: String,
    /// For directory-level problems: the number of entries (not counting cloakfs's own files)
    /// whose names cannot be decrypted because of it.
    pub entries: usize,
}

impl Bad {
    /// The best description of where the problem is: the plaintext path if known, else the
    /// plaintext directory and the backing name.
    pub fn location(&self) -> String {
        match &self.plain {
            Some(p) => display_plain(p),
            None => format!(
                "{} in {}",
                self.backing
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                display_plain(&self.dir_plain)
            ),
        }
    }
}

/// A plaintext path as shown to the user: `/` for the root, else relative to it with a leading
/// `/`.
pub fn display_plain(p: &Path) -> String {
    format!("/{}", p.display())
}

/// One backing entry.
#[derive(Debug, Clone)]
pub enum Item {
    /// A plaintext entry.
    Entry(Entry),
    /// cloakfs's own file, or a foreign one.
    Internal(Internal),
    /// Something unreadable.
    Bad(Bad),
}

/// Iterator over every backing entry of a volume (see the module documentation).
pub struct Walker<'v> {
    volume: &'v Volume,
    root: PathBuf,
    stack: Vec<(PathBuf, PathBuf)>,
    queue: VecDeque<Item>,
    started: bool,
}

impl<'v> Walker<'v> {
    /// A walker over the cipher directory `cipherdir` of `volume`.
    pub fn new(volume: &'v Volume, cipherdir: &Path) -> Self {
        volume.keep_plaintext_list(cipherdir);
        Self {
            volume,
            root: cipherdir.to_path_buf(),
            stack: Vec::new(),
            queue: VecDeque::new(),
            started: false,
        }
    }

    fn start(&mut self) {
        self.started = true;
        match std::fs::symlink_metadata(&self.root) {
            Ok(meta) => {
                self.queue.push_back(Item::Entry(Entry {
                    plain: PathBuf::new(),
                    backing: self.root.clone(),
                    kind: EntryType::Dir,
                    meta,
                    long_name: false,
                    conflict: None,
                }));
                self.stack.push((self.root.clone(), PathBuf::new()));
            }
            Err(e) => self.queue.push_back(Item::Bad(Bad {
                backing: self.root.clone(),
                plain: Some(PathBuf::new()),
                dir_plain: PathBuf::new(),
                kind: BadKind::Stat,
                detail: e.to_string(),
                entries: 0,
            })),
        }
    }

    fn visit(&mut self, dir: PathBuf, plain: PathBuf) {
        let is_root = dir == self.root;
        let mut names: Vec<OsString> = match std::fs::read_dir(&dir) {
            Ok(rd) => {
                let mut v = Vec::new();
                for e in rd {
                    match e {
                        Ok(e) => v.push(e.file_name()),
                        Err(e) => {
                            self.queue.push_back(bad_dir(
                                &dir,
                                &plain,
                                BadKind::ReadDir,
                                e.to_string(),
                                0,
                            ));
                            return;
                        }
                    }
                }
                v
            }
            Err(e) => {
                self.queue
                    .push_back(bad_dir(&dir, &plain, BadKind::ReadDir, e.to_string(), 0));
                return;
            }
        };
        names.sort();
        let payload = names.iter().filter(|n| is_payload(n)).count();
        let dir_id = if is_root {
            Ok(self.volume.root_dir_id())
        } else {
            read_dir_id(&dir)
        };
        let adopted = self.volume.config().params.adopted;
        let dir_id = match dir_id {
            Ok(id) => Some(id),
            // An adopted plaintext directory: nothing encrypted in it yet.
            Err((BadKind::DirIdMissing, _)) if adopted => None,
            Err((kind, detail)) => {
                self.queue
                    .push_back(bad_dir(&dir, &plain, kind, detail, payload));
                None
            }
        };
        let longs = long_names(&names);
        // IDs of the directory's ID-file copies, under which a sync conflict's losing side
        // named its entries.
        let others: Vec<(String, DirId)> = match (&dir_id, is_root) {
            (Some(main), false) => crate::tools::dir_id_merge::named_copies(&dir, &names, main),
            _ => Vec::new(),
        };
        // The entries shown under conflict names, worked out (once) where there is one.
        let mut conflicts = None;
        let listing: Vec<String> = names
            .iter()
            .filter_map(|n| n.to_str().map(str::to_string))
            .collect();
        let work_out = |id: &DirId| {
            crate::sync_folder::conflicts_in_dir(
                self.volume.names(),
                id,
                &others,
                &listing,
                |long| crate::sync_folder::long_name_in(&dir, long),
            )
        };
        let mut subdirs = Vec::new();
        for name in &names {
            let backing = dir.join(name);
            let class = adopted.then(|| {
                self.volume
                    .names()
                    .classify_entry(dir_id.as_ref(), name.as_bytes(), true, |b| {
                        std::fs::read_to_string(dir.join(names::sidecar_name(b)))
                            .map(|s| s.trim_end().to_string())
                            .map_err(|_| "no sidecar")
                    })
            });
            if class == Some(names::Classified::Plain) {
                let shadowed = dir_id.as_ref().is_some_and(|id| {
                    self.volume
                        .names()
                        .encrypt(id, name.as_bytes())
                        .is_ok_and(|s| dir.join(s.backing()).symlink_metadata().is_ok())
                });
                let listed = self
                    .volume
                    .plaintext_listed(dir_id.as_ref(), name.as_bytes());
                let kind = match (listed, shadowed) {
                    (false, _) => InternalKind::PlaintextUnlisted,
                    (true, true) => InternalKind::PlaintextShadowed,
                    (true, false) => InternalKind::Plaintext,
                };
                if kind == InternalKind::Plaintext
                    && backing.symlink_metadata().is_ok_and(|m| m.is_dir())
                {
                    subdirs.push((backing.clone(), plain.join(name)));
                }
                self.queue.push_back(Item::Internal(Internal {
                    backing,
                    dir_plain: plain.clone(),
                    kind,
                }));
                continue;
            }
            let is_copy = |id: &DirId| {
                name.to_str().is_some_and(|b| {
                    crate::sync_folder::open_conflict_copy(self.volume.names(), id, b, |long| {
                        crate::sync_folder::long_name_in(&dir, long)
                    })
                    .is_some()
                })
            };
            // A copy of an entry named under the directory's ID or under an ID-file copy's.
            let of_any = |main: &&DirId| is_copy(main) || others.iter().any(|(_, id)| is_copy(id));
            if let Some(id) = dir_id.as_ref().filter(of_any) {
                let here = conflicts.get_or_insert_with(|| work_out(id));
                if let Some(e) = conflict_entry(here, &dir, &plain, name) {
                    if e.kind == EntryType::Dir {
                        subdirs.push((e.backing.clone(), e.plain.clone()));
                    }
                    self.queue.push_back(Item::Entry(e));
                    continue;
                }
            }
            if let Some(kind) = internal_kind(name, is_root, &longs) {
                self.queue.push_back(Item::Internal(Internal {
                    backing,
                    dir_plain: plain.clone(),
                    kind,
                }));
                continue;
            }
            let Some(dir_id) = dir_id else {
                continue; // counted in the directory's own problem
            };
            let decrypted = decrypt_name(self.volume, &dir_id, &dir, name).map_err(|e| {
                others
                    .iter()
                    .find_map(|(_, id)| decrypt_name(self.volume, id, &dir, name).ok())
                    .ok_or(e)
            });
            let (plain_name, long_name) = match decrypted {
                Ok(x) => x,
                // Named under an ID-file copy: under its own name, or under a conflict name
                // where another entry has that.
                Err(Ok(x)) => {
                    let here = conflicts.get_or_insert_with(|| work_out(&dir_id));
                    if let Some(e) = conflict_entry(here, &dir, &plain, name) {
                        if e.kind == EntryType::Dir {
                            subdirs.push((e.backing.clone(), e.plain.clone()));
                        }
                        self.queue.push_back(Item::Entry(e));
                        continue;
                    }
                    x
                }
                Err(Err((kind, detail))) => {
                    self.queue.push_back(Item::Bad(Bad {
                        backing,
                        plain: None,
                        dir_plain: plain.clone(),
                        kind,
                        detail,
                        entries: 0,
                    }));
                    continue;
                }
            };
            let child_plain = plain.join(OsStr::from_bytes(&plain_name));
            match std::fs::symlink_metadata(&backing) {
                Ok(meta) => {
                    let kind = EntryType::of(&meta);
                    if kind == EntryType::Dir {
                        subdirs.push((backing.clone(), child_plain.clone()));
                    }
                    self.queue.push_back(Item::Entry(Entry {
                        plain: child_plain,
                        backing,
                        kind,
                        meta,
                        long_name,
                        conflict: None,
                    }));
                }
                Err(e) => self.queue.push_back(Item::Bad(Bad {
                    backing,
                    plain: Some(child_plain),
                    dir_plain: plain.clone(),
                    kind: BadKind::Stat,
                    detail: e.to_string(),
                    entries: 0,
                })),
            }
        }
        subdirs.reverse();
        self.stack.extend(subdirs);
    }
}

/// Backing entry `name` of `dir` (plaintext `plain`) where it is shown under a conflict name
/// (`conflicts`: the directory's, [`crate::sync_folder::conflicts_in_dir`]), as the mount
/// lists it.
fn conflict_entry(
    conflicts: &std::collections::BTreeMap<String, crate::sync_folder::ShownConflict>,
    dir: &Path,
    plain: &Path,
    name: &OsStr,
) -> Option<Entry> {
    let c = conflicts.get(name.to_str()?)?;
    let backing = dir.join(name);
    let meta = std::fs::symlink_metadata(&backing).ok()?;
    Some(Entry {
        plain: plain.join(OsStr::from_bytes(&c.shown)),
        kind: EntryType::of(&meta),
        long_name: false,
        backing,
        meta,
        conflict: Some(Box::new((
            c.copy.clone(),
            plain.join(OsStr::from_bytes(&c.original)),
        ))),
    })
}

impl Iterator for Walker<'_> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        if !self.started {
            self.start();
        }
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Some(item);
            }
            let (dir, plain) = self.stack.pop()?;
            self.visit(dir, plain);
        }
    }
}

fn bad_dir(dir: &Path, plain: &Path, kind: BadKind, detail: String, entries: usize) -> Item {
    Item::Bad(Bad {
        backing: dir.to_path_buf(),
        plain: Some(plain.to_path_buf()),
        dir_plain: plain.to_path_buf(),
        kind,
        detail,
        entries,
    })
}

/// Whether a backing name stands for a plaintext entry (as opposed to cloakfs's own files).
pub fn is_payload(name: &OsStr) -> bool {
    match name.to_str() {
        Some(s) => !matches!(names::classify(s), names::EntryKind::Internal),
        None => !name.as_bytes().contains(&b'.'),
    }
}

/// The long names (`cloakfs.long.*` entries) among a directory's `names`: what
/// [`internal_kind`] tells their sidecars' owners by.
pub fn long_names(names: &[OsString]) -> BTreeSet<&OsStr> {
    names
        .iter()
        .filter(|n| {
            matches!(
                n.to_str().map(names::classify),
                Some(names::EntryKind::Long(_))
            )
        })
        .map(OsString::as_os_str)
        .collect()
}

/// Classifies an internal backing name (`None` for names that stand for plaintext entries).
/// `longs` holds the long-name entries present in the same directory ([`long_names`]).
pub fn internal_kind(
    name: &OsStr,
    is_root: bool,
    longs: &BTreeSet<&OsStr>,
) -> Option<InternalKind> {
    if is_payload(name) {
        return None;
    }
    let Some(s) = name.to_str() else {
        return Some(InternalKind::Foreign);
    };
    Some(if s == CONFIG_FILE {
        if is_root {
            InternalKind::Config
        } else {
            InternalKind::StrayReserved
        }
    } else if s == DIRID_FILE {
        if is_root {
            InternalKind::StrayReserved
        } else {
            InternalKind::DirId
        }
    } else if s.starts_with(CONFIG_TEMP_PREFIX) {
        InternalKind::ConfigTemp
    } else if s == REKEY_JOURNAL {
        if is_root {
            InternalKind::RekeyJournal
        } else {
            InternalKind::StrayReserved
        }
    } else if s.starts_with(REKEY_TEMP_PREFIX) {
        InternalKind::RekeyTemp
    } else if s.starts_with(MKDIR_TEMP_PREFIX) {
        InternalKind::MkdirTemp
    } else if s == crate::format::meta::LONG_TARGETS_DIR {
        if is_root {
            InternalKind::LongTargets
        } else {
            InternalKind::StrayReserved
        }
    } else if s == crate::io::retired::RETIRED_DIR {
        if is_root {
            InternalKind::RetiredIds
        } else {
            InternalKind::StrayReserved
        }
    } else if crate::io::plain_list::is_manifest_file(s) {
        if is_root {
            InternalKind::PlaintextList
        } else {
            InternalKind::StrayReserved
        }
    } else if crate::sync_folder::is_sidecar_conflict_copy(s) {
        InternalKind::SidecarConflictCopy
    } else if let Some(entry) = sidecar_entry(s) {
        if longs.contains(OsStr::new(entry)) {
            InternalKind::Sidecar
        } else {
            InternalKind::OrphanSidecar
        }
    } else if !is_root && crate::sync_folder::is_dir_id_copy(s.as_bytes()) {
        InternalKind::DirIdCopy
    } else if s.starts_with(names::RESERVED_PREFIX) {
        InternalKind::StrayReserved
    } else {
        InternalKind::Foreign
    })
}

/// The long-name entry a sidecar name belongs to, if `name` is a sidecar name.
pub fn sidecar_entry(name: &str) -> Option<&str> {
    let entry = name.strip_suffix(LONG_SIDECAR_SUFFIX)?;
    matches!(names::classify(entry), names::EntryKind::Long(_)).then_some(entry)
}

/// Reads the ID of a (non-root) backing directory, distinguishing a missing from a bad file.
pub fn read_dir_id(dir: &Path) -> std::result::Result<DirId, (BadKind, String)> {
    let path = dir.join(DIRID_FILE);
    let mut bytes = Vec::new();
    match std::fs::File::open(&path)
        .and_then(|f| f.take(DIRID_LEN as u64 + 1).read_to_end(&mut bytes))
    {
        Ok(_) => parse_dir_id(&bytes).map_err(|_| {
            (
                BadKind::DirIdInvalid,
                format!(
                    "{DIRID_FILE} has {} bytes instead of {DIRID_LEN}",
                    bytes.len()
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err((BadKind::DirIdMissing, format!("{DIRID_FILE} is missing")))
        }
        Err(e) => Err((BadKind::DirIdInvalid, format!("{DIRID_FILE}: {e}"))),
    }
}

/// Decrypts backing name `name` in backing directory `dir` (ID `dir_id`): the plaintext name and
/// whether it is a long name.
pub fn decrypt_name(
    volume: &Volume,
    dir_id: &DirId,
    dir: &Path,
    name: &OsStr,
) -> std::result::Result<(Vec<u8>, bool), (BadKind, String)> {
    let Some(s) = name.to_str() else {
        return Err((BadKind::Name, "not a valid encrypted name".into()));
    };
    match names::classify(s) {
        names::EntryKind::Internal => Err((BadKind::Name, "a reserved name".into())),
        names::EntryKind::Encrypted(e) => volume
            .names()
            .decrypt_short(dir_id, e)
            .map(|n| (n, false))
            .map_err(|e| (BadKind::Name, name_detail(&e))),
        names::EntryKind::Long(b) => {
            let sidecar = dir.join(names::sidecar_name(b));
            let full = match crate::tools::paths::read_sidecar(&sidecar) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err((
                        BadKind::SidecarMissing,
                        format!("long-name sidecar {} is missing", names::sidecar_name(b)),
                    ))
                }
                Err(e) => return Err((BadKind::SidecarMissing, format!("sidecar: {e}"))),
            };
            if names::long_backing_name(full.trim_end()) != b {
                return Err((
                    BadKind::SidecarMismatch,
                    "long-name sidecar does not match its entry".into(),
                ));
            }
            volume
                .names()
                .decrypt_long(dir_id, b, full.trim_end())
                .map(|n| (n, true))
                .map_err(|e| (BadKind::SidecarMismatch, name_detail(&e)))
        }
    }
}

fn name_detail(e: &Error) -> String {
    match e {
        Error::Tampered(m) => m.clone(),
        e => e.to_string(),
    }
}

/// Sum of the backing sizes of all regular files and number of entries under `root`, without
/// decrypting anything: the totals of a progress bar.
pub fn totals(root: &Path) -> (u64, u64) {
    let mut bytes = 0;
    let mut entries = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if !is_payload(&e.file_name()) {
                continue;
            }
            entries += 1;
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => bytes += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    (bytes, entries)
}

/// Progress of a long offline operation; every method may be called from several threads.
pub trait Progress: Sync {
    /// The amount of work: backing bytes and entries.
    fn start(&self, _bytes: u64, _entries: u64) {}
    /// Work done since the last call.
    fn advance(&self, _bytes: u64, _entries: u64) {}
    /// A new phase begins (for the message next to the bar).
    fn phase(&self, _what: &str) {}
    /// Whether the user asked to stop (SIGINT); checked between atomic steps.
    fn cancelled(&self) -> bool {
        false
    }
}

/// A [`Progress`] that shows nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// Result of [`Walker`] as a vector, for small volumes and tests.
pub fn collect(volume: &Volume, cipherdir: &Path) -> Vec<Item> {
    Walker::new(volume, cipherdir).collect()
}

/// Convenience for tests and tools: the plaintext paths of all readable entries.
pub fn plain_paths(volume: &Volume, cipherdir: &Path) -> Result<Vec<PathBuf>> {
    Ok(collect(volume, cipherdir)
        .into_iter()
        .filter_map(|i| match i {
            Item::Entry(e) if !e.is_root() => Some(e.plain),
            _ => None,
        })
        .collect())
}
