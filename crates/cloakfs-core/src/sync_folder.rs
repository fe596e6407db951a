//! What sync clients keep in the folders they synchronize: a cipher directory that is such a
//! folder (or lies in one) holds these files beside cloakfs's own, and they say nothing about
//! the volume; and the conflict copies they make of cloakfs's entries, which are the user's.

use crate::format::names::{self, DirId, EntryKind, NameCodec, StoredName};

/// Names a sync client keeps in the root of a synchronized folder: Syncthing (`.stfolder`,
/// `.stignore`, `.stversions`), Dropbox (`.dropbox`, `.dropbox.cache`), Resilio (`.sync`),
/// Nextcloud and ownCloud (`.sync_*.db*`, `.owncloudsync.log`, `.nextcloudsync.log`), and
/// macOS's Finder (`.DS_Store`).
pub fn is_client_metadata(name: &[u8]) -> bool {
    const EXACT: [&[u8]; 9] = [
        b".stfolder",
        b".stignore",
        b".stversions",
        b".dropbox",
        b".dropbox.cache",
        b".sync",
        b".owncloudsync.log",
        b".nextcloudsync.log",
        b".DS_Store",
    ];
    EXACT.contains(&name) || (name.starts_with(b".sync_") && name.windows(3).any(|w| w == b".db"))
}

/// The sync client whose naming a conflict copy has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncClient {
    /// `stem.sync-conflict-YYYYMMDD-HHMMSS-DEVICE.ext` (DEVICE: the first 7 characters of the
    /// device ID), as Syncthing's `conflictName` writes it: the marker goes before the last
    /// `.`, so in `cloakfs.long.<hash>` it lands before the hash.
    Syncthing,
    /// `stem (NAME's conflicted copy YYYY-MM-DD).ext`, with ` (N)` inside the parentheses
    /// for further copies of that day.
    Dropbox,
    /// `stem (conflicted copy YYYY-MM-DD HHMMSS).ext` (Nextcloud and ownCloud 2.5+; Nextcloud
    /// may put the user's name before the date).
    Nextcloud,
    /// `stem_conflict-YYYYMMDD-HHMMSS.ext` (ownCloud before 2.5).
    OwnCloud,
    /// `stem-HOSTNAME.ext` (OneDrive's "keep both" with the computer's name).
    OneDrive,
    /// `stem.Conflict.ext`, also `.Conflict1`, `.Conflict 3` (Resilio Sync's help centre,
    /// "Conflict files in Sync").
    Resilio,
    /// `stem (N).ext`: Google Drive for desktop and every client that numbers duplicates.
    Numbered,
}

impl SyncClient {
    /// The client's name as users know it.
    pub fn label(self) -> &'static str {
        match self {
            SyncClient::Syncthing => "Syncthing",
            SyncClient::Dropbox => "Dropbox",
            SyncClient::Nextcloud => "Nextcloud/ownCloud",
            SyncClient::OwnCloud => "ownCloud",
            SyncClient::OneDrive => "OneDrive",
            SyncClient::Resilio => "Resilio",
            SyncClient::Numbered => "Google Drive or a numbered copy",
        }
    }
}

/// One way to read a backing name as a sync client's conflict copy of another backing name.
/// Parsing alone is ambiguous (OneDrive's `-HOST`: `-` is in base64url); a reader accepts a
/// reading only if `original` opens in the directory (see FORMAT.md section 2.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflictCopy {
    /// The backing name the client copied.
    pub original: String,
    /// Whose naming it is.
    pub client: SyncClient,
    /// `YYYY-MM-DD`, where the name says.
    pub date: Option<String>,
    /// `HH:MM:SS`, where the name says.
    pub time: Option<String>,
    /// Device, host or user name, or a copy number, where the name says.
    pub device: Option<String>,
}

impl ConflictCopy {
    /// The words after "conflict" in a shown name: date and device (or number), or the
    /// client where the name carries neither.
    pub fn label(&self) -> String {
        let parts: Vec<&str> = [self.date.as_deref(), self.device.as_deref()]
            .into_iter()
            .flatten()
            .collect();
        if parts.is_empty() {
            self.client.label().to_string()
        } else {
            parts.join(" ")
        }
    }

    /// How fsck describes the copy: client, date and time, device.
    pub fn describe(&self) -> String {
        let mut s = self.client.label().to_string();
        match (&self.date, &self.time) {
            (Some(d), Some(t)) => s.push_str(&format!(", {d} {t}")),
            (Some(d), None) => s.push_str(&format!(", {d}")),
            _ => {}
        }
        if let Some(dev) = &self.device {
            let what = match self.client {
                SyncClient::Dropbox | SyncClient::Nextcloud => "user",
                SyncClient::OneDrive => "host",
                SyncClient::Numbered | SyncClient::Resilio => "copy",
                _ => "device",
            };
            s.push_str(&format!(", {what} {dev}"));
        }
        s
    }
}

/// Every reading of `backing` as a conflict copy, in the order a reader tries them (none for
/// an ordinary name). Only the shape is checked here; see [`ConflictCopy`].
pub fn conflict_readings(backing: &str) -> Vec<ConflictCopy> {
    let mut out = Vec::new();
    // Each client puts its marker before the extension (the part from the last `.`), or at
    // the end of a name without one.
    for (at, _) in backing.char_indices() {
        let (head, tail) = backing.split_at(at);
        if head.is_empty() {
            continue;
        }
        for (client, marker_len, date, time, device) in markers(tail) {
            let ext = &tail[marker_len..];
            if !(ext.is_empty() || (ext.starts_with('.') && !ext[1..].contains('.'))) {
                continue;
            }
            if client == SyncClient::OneDrive && head.ends_with('-') {
                continue;
            }
            out.push(ConflictCopy {
                original: format!("{head}{ext}"),
                client,
                date,
                time,
                device,
            });
        }
    }
    out
}

type Marker = (
    SyncClient,
    usize,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// The client markers `s` starts with, each with its length and what it says.
fn markers(s: &str) -> Vec<Marker> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    // Syncthing: .sync-conflict-YYYYMMDD-HHMMSS-XXXXXXX
    if let Some(r) = s.strip_prefix(".sync-conflict-") {
        let rb = r.as_bytes();
        if rb.len() >= 23
            && digits(&rb[..8])
            && rb[8] == b'-'
            && digits(&rb[9..15])
            && rb[15] == b'-'
            && rb[16..23]
                .iter()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        {
            out.push((
                SyncClient::Syncthing,
                15 + 23,
                Some(ymd(&r[..8])),
                Some(hms(&r[9..15])),
                Some(r[16..23].to_string()),
            ));
        }
    }
    // ownCloud before 2.5: _conflict-YYYYMMDD-HHMMSS
    if let Some(r) = s.strip_prefix("_conflict-") {
        let rb = r.as_bytes();
        if rb.len() >= 15 && digits(&rb[..8]) && rb[8] == b'-' && digits(&rb[9..15]) {
            out.push((
                SyncClient::OwnCloud,
                10 + 15,
                Some(ymd(&r[..8])),
                Some(hms(&r[9..15])),
                None,
            ));
        }
    }
    if let Some(r) = s.strip_prefix(" (") {
        if let Some(close) = paren_end(r) {
            let inner = &r[..close];
            let len = 2 + close + 1;
            if let Some((who, rest)) = inner.split_once("'s conflicted copy ") {
                // Dropbox: (NAME's conflicted copy YYYY-MM-DD) or (... YYYY-MM-DD (N))
                let (date, n) = match rest.split_once(" (") {
                    Some((d, n)) => (d, n.strip_suffix(')')),
                    None => (rest, Some("")),
                };
                if is_date(date) && n.is_some_and(|n| n.is_empty() || digits(n.as_bytes())) {
                    let n = n.unwrap_or_default();
                    let device = if n.is_empty() {
                        who.to_string()
                    } else {
                        format!("{who} {n}")
                    };
                    out.push((
                        SyncClient::Dropbox,
                        len,
                        Some(date.to_string()),
                        None,
                        Some(device),
                    ));
                }
            } else if let Some(rest) = inner.strip_prefix("conflicted copy ") {
                // Nextcloud: (conflicted copy [USER ]YYYY-MM-DD HHMMSS)
                // The date and time are the last 17 bytes, all ASCII (a name may hold other
                // text there: no cut inside a character).
                let rb = rest.as_bytes();
                if rb.len() >= 17 && rb[rb.len() - 17..].is_ascii() {
                    let (user, dt) = rest.split_at(rest.len() - 17);
                    let dtb = dt.as_bytes();
                    let user = user.strip_suffix(' ');
                    if is_date(&dt[..10])
                        && dtb[10] == b' '
                        && digits(&dtb[11..])
                        && (user.is_some() || rest.len() == 17)
                    {
                        out.push((
                            SyncClient::Nextcloud,
                            len,
                            Some(dt[..10].to_string()),
                            Some(hms(&dt[11..])),
                            user.map(str::to_string),
                        ));
                    }
                }
            } else if !inner.is_empty() && digits(inner.as_bytes()) {
                out.push((
                    SyncClient::Numbered,
                    len,
                    None,
                    None,
                    Some(inner.to_string()),
                ));
            }
        }
    }
    // Resilio: .Conflict, .Conflict1, .Conflict 3
    if let Some(r) = s.strip_prefix(".Conflict") {
        let n = r.strip_prefix(' ').unwrap_or(r);
        let nd = n.bytes().take_while(u8::is_ascii_digit).count();
        let spaced = n.len() != r.len();
        if !(spaced && nd == 0) {
            let len = 9 + usize::from(spaced) + nd;
            let device = (nd > 0).then(|| n[..nd].to_string());
            out.push((SyncClient::Resilio, len, None, None, device));
        }
    }
    // OneDrive: -HOSTNAME (letters, digits, `-`)
    if b.first() == Some(&b'-') {
        let host = b[1..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == b'-' || **c == b'_')
            .count();
        if host > 0 {
            out.push((
                SyncClient::OneDrive,
                1 + host,
                None,
                None,
                Some(s[1..1 + host].to_string()),
            ));
        }
    }
    out
}

fn digits(b: &[u8]) -> bool {
    !b.is_empty() && b.iter().all(u8::is_ascii_digit)
}

fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && digits(&b[..4])
        && b[4] == b'-'
        && digits(&b[5..7])
        && b[7] == b'-'
        && digits(&b[8..])
}

fn ymd(s: &str) -> String {
    format!("{}-{}-{}", &s[..4], &s[4..6], &s[6..8])
}

fn hms(s: &str) -> String {
    format!("{}:{}:{}", &s[..2], &s[2..4], &s[4..6])
}

/// Index of the `)` closing a parenthesis opened just before `s`, nested ones counted.
fn paren_end(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(i),
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// Whether a plaintext name has the shape of a conflict copy's shown name
/// ([`shown_conflict_name`]): what a lookup must check before it looks further.
pub fn has_shown_conflict_shape(name: &[u8]) -> bool {
    name.windows(SHOWN_MARK.len())
        .any(|w| w == SHOWN_MARK.as_bytes())
}

const SHOWN_MARK: &str = " (conflict ";

/// The readable name of a conflict copy whose original's plaintext name is `plain`:
/// `stem (conflict LABEL)ext`, the extension being the plain name's last `.` part (not a
/// leading one). `tag` (a few characters that tell this backing entry apart) goes into the
/// label when another entry already has the plain result. At most 255 bytes: a long stem is
/// shortened.
pub fn shown_conflict_name(plain: &[u8], copy: &ConflictCopy, tag: Option<&str>) -> Vec<u8> {
    let split = plain
        .iter()
        .rposition(|&c| c == b'.')
        .filter(|&i| i > 0 && plain.len() - i <= 16)
        .unwrap_or(plain.len());
    let (stem, ext) = plain.split_at(split);
    let mut label = format!("{SHOWN_MARK}{}", copy.label().replace('/', "_"));
    if let Some(t) = tag {
        label.push_str(&format!(" #{t}"));
    }
    label.push(')');
    let room = 255usize.saturating_sub(label.len() + ext.len());
    let mut stem = stem;
    if stem.len() > room {
        stem = &stem[..room];
        // Cut on a character boundary where the stem is text: up to 3 more bytes.
        for _ in 0..3 {
            if stem.is_empty() || std::str::from_utf8(stem).is_ok() {
                break;
            }
            stem = &stem[..stem.len() - 1];
        }
    }
    let mut out = stem.to_vec();
    out.extend_from_slice(label.as_bytes());
    out.extend_from_slice(ext);
    out
}

/// The reading of backing entry `backing` (in the directory whose ID is `dir`) as a conflict
/// copy whose original name opens, with that original's plaintext name; None for every
/// other entry. `sidecar` gives the full encrypted name of a long original (from its
/// sidecar, or from the sidecar's own conflict copy when the original's is gone).
pub fn open_conflict_copy(
    names: &NameCodec,
    dir: &DirId,
    backing: &str,
    mut sidecar: impl FnMut(&str) -> Option<String>,
) -> Option<(ConflictCopy, Vec<u8>)> {
    conflict_readings(backing).into_iter().find_map(|c| {
        let plain = match names::classify(&c.original) {
            EntryKind::Encrypted(e) => names.decrypt_short(dir, e).ok()?,
            EntryKind::Long(b) if is_long_entry_name(b) => {
                names.decrypt_long(dir, b, &sidecar(b)?).ok()?
            }
            EntryKind::Long(_) => return None,
            EntryKind::Internal => return None,
        };
        Some((c, plain))
    })
}

/// The tag that tells conflict copy `backing` apart in its shown name when another entry
/// already has the untagged one: 6 hex digits of SHA-256 of the backing name (the same on
/// every device, in every listing).
pub fn conflict_tag(backing: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(backing.as_bytes())[..3]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A conflict copy as every reader shows it: the accepted reading, the original's plaintext
/// name, and the shown name, tagged ([`conflict_tag`]) where `exists` says an entry of the
/// directory already has the untagged one (as a backing name).
pub fn shown_conflict_entry(
    names: &NameCodec,
    dir: &DirId,
    backing: &str,
    sidecar: impl FnMut(&str) -> Option<String>,
    mut exists: impl FnMut(&str) -> bool,
) -> Option<(ConflictCopy, Vec<u8>, Vec<u8>)> {
    let (copy, plain) = open_conflict_copy(names, dir, backing, sidecar)?;
    let shown = shown_conflict_name(&plain, &copy, None);
    let taken = names
        .encrypt(dir, &shown)
        .is_ok_and(|s| exists(s.backing()));
    let shown = if taken {
        shown_conflict_name(&plain, &copy, Some(&conflict_tag(backing)))
    } else {
        shown
    };
    Some((copy, plain, shown))
}

/// How an entry of a directory is listed when it is shown under a conflict name: a sync
/// client's conflict copy, or an entry named under a copy of the directory's ID file whose
/// plaintext name an entry named under the directory's ID (or under an earlier copy) already
/// has. Every reader (the mount, `fsck`, `export`, `name -d`) names them by
/// [`conflicts_in_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownConflict {
    /// What it is: the client's reading of the copy's name (for an entry under an ID-file
    /// copy, the reading of that file's name, [`dir_id_copy_reading`]).
    pub copy: ConflictCopy,
    /// The plaintext name of the entry it is a copy of (or that it shares).
    pub original: Vec<u8>,
    /// The name it is listed under.
    pub shown: Vec<u8>,
}

/// The reading of an ID-file copy's name (`cloakfs.sync-conflict-...dirid`, `cloakfs
/// (1).dirid`, ...): what labels the entries named under its ID that are shown under a
/// conflict name. A name no client's reading fits gets a generic label.
pub fn dir_id_copy_reading(name: &str) -> ConflictCopy {
    conflict_readings(name)
        .into_iter()
        .find(|c| c.original == names::DIRID_FILE)
        .unwrap_or_else(|| ConflictCopy {
            original: names::DIRID_FILE.to_string(),
            client: SyncClient::Numbered,
            date: None,
            time: None,
            device: Some(conflict_tag(name)),
        })
}

/// Where a reader finds plaintext `name` in a directory: the backing name it looks up, and
/// which of the directory's IDs names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The backing entry (for a conflict copy, its own backing name as a short name: a copy
    /// has no sidecar of its own).
    pub stored: StoredName,
    /// Under which ID-file copy's ID (an index into the `others` given) the entry is named,
    /// if not under the directory's ID; None also for a conflict copy.
    pub under_copy: Option<usize>,
    /// The entry listed under `name` as a conflict name, if that is what `name` is.
    pub conflict: Option<ShownConflict>,
}

/// Where plaintext `name` of a directory is, as the mount's lookup finds it (FORMAT.md
/// sections 2.1 and 9.2): its stored form under the directory's ID `main` if that `exists`,
/// else under the first of the ID-file copies' IDs `others` (in their order) under which it
/// exists, else the entry listed under `name` as a conflict name (`conflicts`, worked out
/// only for a name of the shown shape that is found nowhere else). A name found nowhere is
/// its stored form under `main` (where a new entry of that name goes).
pub fn locate(
    codec: &NameCodec,
    main: &DirId,
    others: &[DirId],
    name: &[u8],
    exists: impl Fn(&str) -> bool,
    conflicts: impl FnOnce() -> std::collections::BTreeMap<String, ShownConflict>,
) -> crate::error::Result<Located> {
    let stored = codec.encrypt(main, name)?;
    let at = |stored, under_copy| Located {
        stored,
        under_copy,
        conflict: None,
    };
    if exists(stored.backing()) {
        return Ok(at(stored, None));
    }
    for (k, id) in others.iter().enumerate() {
        let s = codec.encrypt(id, name)?;
        if exists(s.backing()) {
            return Ok(at(s, Some(k)));
        }
    }
    if has_shown_conflict_shape(name) {
        if let Some((backing, c)) = conflicts().into_iter().find(|(_, c)| c.shown == name) {
            return Ok(Located {
                stored: StoredName::Short(backing),
                under_copy: None,
                conflict: Some(c),
            });
        }
    }
    Ok(at(stored, None))
}

/// Every entry of a backing directory that is listed under a conflict name, by backing name
/// (FORMAT.md section 2.1, "Conflict copies", and section 9.2). `main` is the directory's ID
/// (from `cloakfs.dirid`), `others` its ID-file copies (name and ID, sorted by name, without
/// `main`), `listing` every backing name in it; `sidecar` gives a long entry's full encrypted
/// name ([`long_name_in`]).
///
/// The shown names are distinct and the same in every listing, on every device: a shown name
/// is `STEM (conflict LABEL)EXT` ([`shown_conflict_name`]), and it carries the tag
/// ([`conflict_tag`] of the backing name) where an entry of the directory has it as its
/// plaintext name or another entry here would be shown under it too. An entry named under an
/// ID-file copy is shown under its own name unless an entry named under `main`, or under an
/// earlier copy in `others`, has that name. A conflict copy's original is looked for under
/// `main`, and, where an entry does not open under any ID, under each of `others`.
pub fn conflicts_in_dir(
    codec: &NameCodec,
    main: &DirId,
    others: &[(String, DirId)],
    listing: &[String],
    mut sidecar: impl FnMut(&str) -> Option<String>,
) -> std::collections::BTreeMap<String, ShownConflict> {
    use std::collections::{BTreeMap, HashSet};
    let present: HashSet<&str> = listing.iter().map(String::as_str).collect();
    let mut sorted: Vec<&str> = listing.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    fn open(
        codec: &NameCodec,
        id: &DirId,
        b: &str,
        sidecar: &mut impl FnMut(&str) -> Option<String>,
    ) -> Option<Vec<u8>> {
        match names::classify(b) {
            EntryKind::Encrypted(e) => codec.decrypt_short(id, e).ok(),
            EntryKind::Long(l) if is_long_entry_name(l) => {
                codec.decrypt_long(id, l, &sidecar(l)?).ok()
            }
            _ => None,
        }
    }
    let exists_under = |id: &DirId, plain: &[u8]| {
        codec
            .encrypt(id, plain)
            .is_ok_and(|s| present.contains(s.backing()))
    };
    let mut found: Vec<(&str, ConflictCopy, Vec<u8>)> = Vec::new();
    // Entries named under the ID-file copies: (copy index, backing name, plaintext name).
    let mut under_others: Vec<(usize, &str, Vec<u8>)> = Vec::new();
    for b in sorted {
        if open(codec, main, b, &mut sidecar).is_some() {
            continue;
        }
        if let Some((copy, plain)) = open_conflict_copy(codec, main, b, &mut sidecar) {
            found.push((b, copy, plain));
            continue;
        }
        if let Some((k, plain)) = others
            .iter()
            .enumerate()
            .find_map(|(k, (_, id))| open(codec, id, b, &mut sidecar).map(|p| (k, p)))
        {
            under_others.push((k, b, plain));
            continue;
        }
        // A copy of an entry named under an ID-file copy's ID.
        if let Some((copy, plain)) = others
            .iter()
            .find_map(|(_, id)| open_conflict_copy(codec, id, b, &mut sidecar))
        {
            found.push((b, copy, plain));
        }
    }
    // The first ID that has a name keeps it, as a lookup finds it.
    under_others.sort();
    let mut had: HashSet<Vec<u8>> = HashSet::new();
    for (k, b, plain) in under_others {
        if exists_under(main, &plain) || !had.insert(plain.clone()) {
            found.push((b, dir_id_copy_reading(&others[k].0), plain));
        }
    }
    let untagged: Vec<Vec<u8>> = found
        .iter()
        .map(|(_, copy, plain)| shown_conflict_name(plain, copy, None))
        .collect();
    let mut out = BTreeMap::new();
    for (i, (b, copy, plain)) in found.into_iter().enumerate() {
        let u = &untagged[i];
        let shared = untagged.iter().filter(|x| *x == u).count() > 1;
        let taken = std::iter::once(main)
            .chain(others.iter().map(|(_, id)| id))
            .any(|id| exists_under(id, u));
        let shown = if shared || taken {
            shown_conflict_name(&plain, &copy, Some(&conflict_tag(b)))
        } else {
            u.clone()
        };
        out.insert(
            b.to_string(),
            ShownConflict {
                copy,
                original: plain,
                shown,
            },
        );
    }
    out
}

/// After conflict copy `removed` of a long-name entry is gone from its directory (deleted or
/// renamed through the mount), the conflict copies of that entry's sidecar to remove with it
/// (`listing`: the backing names left in the directory). The ones the client made with the
/// copy (the same marker) go, unless the entries left that need a sidecar (the long entry or
/// another copy of it) would have none left; with no such entry left, all of them go.
pub fn sidecar_copies_left_by(removed: &str, listing: &[String]) -> Vec<String> {
    let Some(copy) = conflict_readings(removed)
        .into_iter()
        .find(|c| is_long_entry_name(&c.original))
    else {
        return Vec::new();
    };
    let long = copy.original.as_str();
    let side = names::sidecar_name(long);
    let same_marker = |c: &ConflictCopy| {
        (c.client, &c.date, &c.time, &c.device)
            == (copy.client, &copy.date, &copy.time, &copy.device)
    };
    let side_copies: Vec<(&String, bool)> = listing
        .iter()
        .filter(|n| **n != side)
        .filter_map(|n| {
            let r = conflict_readings(n)
                .into_iter()
                .find(|c| c.original == side)?;
            Some((n, same_marker(&r)))
        })
        .collect();
    let needed = listing
        .iter()
        .any(|n| n == long || (n != removed && is_conflict_copy_of(n, long)));
    if !needed {
        return side_copies.into_iter().map(|(n, _)| n.clone()).collect();
    }
    let own: Vec<String> = side_copies
        .iter()
        .filter(|(_, same)| *same)
        .map(|(n, _)| (*n).clone())
        .collect();
    let other_source = listing.contains(&side) || side_copies.len() > own.len();
    if other_source {
        own
    } else {
        Vec::new()
    }
}

/// The full encrypted name of long entry `long` in backing directory `dir`, for
/// [`open_conflict_copy`]: from its sidecar, or, where the sync client left only a conflict
/// copy of the sidecar, from that copy (a sidecar's content is fixed by its entry's name, so
/// every copy of it holds the same name).
pub fn long_name_in(dir: &std::path::Path, long: &str) -> Option<String> {
    let read = |side: &str| {
        let full = crate::tools::paths::read_sidecar(&dir.join(side)).ok()?;
        let full = full.trim_end().to_string();
        (names::long_backing_name(&full) == long).then_some(full)
    };
    let side = names::sidecar_name(long);
    if let Some(full) = read(&side) {
        return Some(full);
    }
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let n = e.file_name().into_string().ok()?;
        (n != side && n.starts_with(long) && is_conflict_copy_of(&n, &side))
            .then(|| read(&n))
            .flatten()
    })
}

/// Whether backing name `name` reads as a conflict copy of backing name `original`.
pub fn is_conflict_copy_of(name: &str, original: &str) -> bool {
    conflict_readings(name)
        .iter()
        .any(|c| c.original == original)
}

/// Whether backing name `name` is a conflict copy of a long name's sidecar: internal, but a
/// copy the entry's own conflict copy may need, so never removed as a stray.
pub fn is_sidecar_conflict_copy(name: &str) -> bool {
    let sidecar_of_entry = |n: &str| {
        n.strip_suffix(names::LONG_SIDECAR_SUFFIX)
            .is_some_and(is_long_entry_name)
    };
    // A sidecar itself (its hash may hold a `-`, which reads as OneDrive's marker) is none.
    !sidecar_of_entry(name)
        && conflict_readings(name)
            .iter()
            .any(|c| sidecar_of_entry(&c.original))
}

/// Whether `name` has the form of a long-name entry: the prefix and a 43-character hash.
fn is_long_entry_name(name: &str) -> bool {
    name.strip_prefix(names::LONG_PREFIX)
        .is_some_and(|h| h.len() == 43 && matches!(names::classify(name), EntryKind::Long(_)))
}

/// Whether `name` is a sync client's copy of a directory's `cloakfs.dirid`: the losing side of
/// a conflict between two devices that gave one directory different IDs, renamed by the client
/// (Syncthing `cloakfs.sync-conflict-YYYYMMDD-HHMMSS-DEVICE.dirid`, Dropbox
/// `cloakfs (NAME's conflicted copy DATE).dirid`, Nextcloud `cloakfs (conflicted copy DATE
/// TIME).dirid`, OneDrive `cloakfs-HOST.dirid`, generic `cloakfs (1).dirid`). Such a file
/// holds another 16-byte ID the directory's entries may be named under.
pub fn is_dir_id_copy(name: &[u8]) -> bool {
    name.starts_with(b"cloakfs")
        && name != crate::format::names::DIRID_FILE.as_bytes()
        && name.windows(5).any(|w| w == b"dirid")
}

#[cfg(test)]
mod tests {
    use crate::crypto::secret::SecretBytes;
    use crate::format::names::StoredName;

    fn codec() -> NameCodec {
        NameCodec::new(SecretBytes::from_slice(&[3u8; 64]), 255)
    }

    const DIR: DirId = DirId([7; 16]);

    fn short(c: &NameCodec, plain: &str) -> String {
        match c.encrypt(&DIR, plain.as_bytes()).unwrap() {
            StoredName::Short(s) => s,
            StoredName::Long { .. } => panic!("long"),
        }
    }

    /// Opens `copy` in DIR with no long names around.
    fn open(c: &NameCodec, copy: &str) -> Option<(ConflictCopy, String)> {
        open_conflict_copy(c, &DIR, copy, |_| None)
            .map(|(cc, p)| (cc, String::from_utf8(p).unwrap()))
    }

    fn shown(c: &NameCodec, copy: &str) -> String {
        let (cc, plain) = open(c, copy).expect(copy);
        String::from_utf8(shown_conflict_name(plain.as_bytes(), &cc, None)).unwrap()
    }

    #[test]
    fn syncthing_copies_of_short_and_long_names_and_sidecars() {
        let c = codec();
        let e = short(&c, "report.txt");
        let copy = format!("{e}.sync-conflict-20261128-101010-4CTITOD");
        let (cc, plain) = open(&c, &copy).unwrap();
        assert_eq!(plain, "report.txt");
        assert_eq!(cc.client, SyncClient::Syncthing);
        assert_eq!(cc.original, e);
        assert_eq!(
            cc.describe(),
            "Syncthing, 2026-11-28 10:10:10, device 4CTITOD"
        );
        assert_eq!(shown(&c, &copy), "report (conflict 2026-11-28 4CTITOD).txt");
        // A long name: the marker lands before the hash.
        let long = "l".repeat(240) + ".txt";
        let StoredName::Long { backing, full } = c.encrypt(&DIR, long.as_bytes()).unwrap() else {
            panic!()
        };
        let hash = backing.strip_prefix("cloakfs.long.").unwrap();
        let copy = format!("cloakfs.long.sync-conflict-20261128-101010-4CTITOD.{hash}");
        let got = open_conflict_copy(&c, &DIR, &copy, |b| (b == backing).then(|| full.clone()));
        let (cc, plain) = got.unwrap();
        assert_eq!(plain, long.as_bytes());
        let s = shown_conflict_name(&plain, &cc, None);
        assert!(s.len() <= 255 && s.ends_with(b" (conflict 2026-11-28 4CTITOD).txt"));
        // Its sidecar's copy names the sidecar (internal, never opened as an entry).
        let side = format!("{backing}.sync-conflict-20261128-101010-4CTITOD.name");
        let readings = conflict_readings(&side);
        assert!(readings
            .iter()
            .any(|r| r.original == format!("{backing}.name")));
        assert!(open_conflict_copy(&c, &DIR, &side, |_| Some(full.clone())).is_none());
    }

    #[test]
    fn a_sidecar_whose_hash_holds_a_dash_is_no_copy_of_one() {
        let hash = "AB-cd_ef".repeat(5) + "xyz";
        assert_eq!(hash.len(), 43);
        let side = format!("cloakfs.long.{hash}.name");
        assert!(!is_sidecar_conflict_copy(&side));
        let copy = format!("cloakfs.long.{hash}.{ST}.name");
        assert!(is_sidecar_conflict_copy(&copy));
    }

    const ST: &str = "sync-conflict-20261128-101010-4CTITOD";

    #[test]
    fn dropbox_copies() {
        let c = codec();
        let e = short(&c, "notes.md");
        let copy = format!("{e} (Ann's conflicted copy 2026-11-28)");
        assert_eq!(shown(&c, &copy), "notes (conflict 2026-11-28 Ann).md");
        let copy = format!("{e} (Ann's conflicted copy 2026-11-28 (1))");
        assert_eq!(shown(&c, &copy), "notes (conflict 2026-11-28 Ann 1).md");
        assert_eq!(open(&c, &copy).unwrap().0.client, SyncClient::Dropbox);
    }

    #[test]
    fn nextcloud_and_owncloud_copies() {
        let c = codec();
        let e = short(&c, "plan");
        let copy = format!("{e} (conflicted copy 2026-11-28 101010)");
        let (cc, _) = open(&c, &copy).unwrap();
        assert_eq!(cc.client, SyncClient::Nextcloud);
        assert_eq!(cc.time.as_deref(), Some("10:10:10"));
        assert_eq!(shown(&c, &copy), "plan (conflict 2026-11-28)");
        let copy = format!("{e} (conflicted copy bob 2026-11-28 101010)");
        assert_eq!(shown(&c, &copy), "plan (conflict 2026-11-28 bob)");
        let copy = format!("{e}_conflict-20261128-101010");
        let (cc, _) = open(&c, &copy).unwrap();
        assert_eq!(cc.client, SyncClient::OwnCloud);
        assert_eq!(shown(&c, &copy), "plan (conflict 2026-11-28)");
    }

    #[test]
    fn onedrive_copies_are_told_apart_by_what_opens() {
        let c = codec();
        // Find a name whose encrypted form holds a `-`: a OneDrive parse splits there too,
        // and only the reading whose base opens is taken.
        let (plain, e) = (0..)
            .map(|i| format!("doc{i}.pdf"))
            .map(|p| {
                let e = short(&c, &p);
                (p, e)
            })
            .find(|(_, e)| e[1..].contains('-'))
            .unwrap();
        let copy = format!("{e}-LAPTOP-7");
        let (cc, got) = open(&c, &copy).unwrap();
        assert_eq!(
            (cc.client, got.as_str()),
            (SyncClient::OneDrive, plain.as_str())
        );
        assert_eq!(cc.device.as_deref(), Some("LAPTOP-7"));
        assert!(conflict_readings(&copy).len() >= 2, "ambiguous by shape");
    }

    #[test]
    fn resilio_and_numbered_copies() {
        let c = codec();
        let e = short(&c, "photo.jpg");
        for (copy, want) in [
            (format!("{e}.Conflict"), "photo (conflict Resilio).jpg"),
            (format!("{e}.Conflict2"), "photo (conflict 2).jpg"),
            (format!("{e}.Conflict 3"), "photo (conflict 3).jpg"),
            (format!("{e} (1)"), "photo (conflict 1).jpg"),
        ] {
            assert_eq!(shown(&c, &copy), want, "{copy}");
        }
    }

    #[test]
    fn ordinary_and_foreign_names_are_no_conflict_copies() {
        let c = codec();
        let e = short(&c, "a");
        for n in [
            e.clone(),
            "cloakfs.dirid".into(),
            "cloakfs.conf".into(),
            format!("{e}.sync-conflict-2026112-101010-4CTITOD"),
            format!("{e}.sync-conflict-20261128-101010-4CTITOD.x.y"),
            format!("{e}x (1)"),
            "report (1).txt".into(),
        ] {
            assert!(open(&c, &n).is_none(), "{n}");
        }
        // Syncthing's copy of a directory's ID file: a conflict, but no entry.
        assert!(open(&c, "cloakfs.sync-conflict-20261128-101010-4CTITOD.dirid").is_none());
    }

    #[test]
    fn shown_names_stay_within_name_max_and_carry_a_tag_when_asked() {
        let cc = conflict_readings("x.sync-conflict-20261128-101010-4CTITOD").remove(0);
        let long = vec![b'a'; 255];
        assert_eq!(shown_conflict_name(&long, &cc, None).len(), 255);
        let tagged = shown_conflict_name(b"r.txt", &cc, Some("ab12cd"));
        assert_eq!(tagged, b"r (conflict 2026-11-28 4CTITOD #ab12cd).txt");
        assert!(has_shown_conflict_shape(&tagged));
        assert!(!has_shown_conflict_shape(b"r (conflicted).txt"));
        // A leading dot is no extension.
        assert_eq!(
            shown_conflict_name(b".bashrc", &cc, None),
            b".bashrc (conflict 2026-11-28 4CTITOD)"
        );
    }

    #[test]
    fn names_with_other_text_where_a_date_may_be_are_read_without_a_panic() {
        // A Nextcloud-shaped marker whose last 17 bytes start inside a character.
        for n in [
            "abc (conflicted copy \u{fc}2026-11-28 10101)",
            "abc (conflicted copy 2026-11-2\u{fc} 10101)",
        ] {
            assert!(
                conflict_readings(n)
                    .iter()
                    .all(|c| c.client != SyncClient::Nextcloud),
                "{n}"
            );
        }
    }

    #[test]
    fn only_a_stem_that_was_cut_is_cut_back_to_a_character_boundary() {
        let cc = conflict_readings("x.sync-conflict-20261128-101010-4CTITOD").remove(0);
        let label = " (conflict 2026-11-28 4CTITOD)".len();
        // Not text, and it fits exactly: kept whole.
        let stem = vec![0xff; 255 - label];
        assert_eq!(shown_conflict_name(&stem, &cc, None).len(), 255);
        // Text cut inside a 2-byte character: the half character goes.
        let stem = "\u{e9}".repeat(200);
        let shown = shown_conflict_name(stem.as_bytes(), &cc, None);
        assert_eq!(shown.len(), 254);
        assert!(std::str::from_utf8(&shown).is_ok());
    }

    use super::*;

    const OTHER: DirId = DirId([9; 16]);
    const ID_COPY: &str = "cloakfs.sync-conflict-20261128-151500-K64EJMH.dirid";

    fn shown_in(c: &NameCodec, others: &[(String, DirId)], listing: &[String]) -> Vec<String> {
        conflicts_in_dir(c, &DIR, others, listing, |_| None)
            .into_values()
            .map(|v| String::from_utf8(v.shown).unwrap())
            .collect()
    }

    #[test]
    fn copies_with_one_label_get_distinct_names_the_same_in_any_order() {
        let c = codec();
        let e = short(&c, "report.txt");
        // Same day, same device, another time; and two numbered forms.
        let a = format!("{e}.sync-conflict-20261128-101010-4CTITOD");
        let b = format!("{e}.sync-conflict-20261128-121212-4CTITOD");
        let n1 = format!("{e} (1)");
        let n2 = format!("{e}.Conflict1");
        let mut listing = vec![e.clone(), a.clone(), b.clone(), n1.clone(), n2.clone()];
        let got = shown_in(&c, &[], &listing);
        listing.reverse();
        assert_eq!(shown_in(&c, &[], &listing), got);
        let mut dedup = got.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), 4, "{got:?}");
        let tagged =
            |b: &str, label: &str| format!("report (conflict {label} #{}).txt", conflict_tag(b));
        for (b, label) in [
            (&a, "2026-11-28 4CTITOD"),
            (&b, "2026-11-28 4CTITOD"),
            (&n1, "1"),
            (&n2, "1"),
        ] {
            assert!(got.contains(&tagged(b, label)), "{b}: {got:?}");
        }
        // Alone, a copy keeps the plain shown name.
        assert_eq!(
            shown_in(&c, &[], &[e, a]),
            ["report (conflict 2026-11-28 4CTITOD).txt"]
        );
    }

    #[test]
    fn a_name_taken_under_both_ids_is_shown_under_the_id_copys_conflict_name() {
        let c = codec();
        let main = short(&c, "same.txt");
        let under = |plain: &str| match c.encrypt(&OTHER, plain.as_bytes()).unwrap() {
            StoredName::Short(s) => s,
            StoredName::Long { .. } => panic!("long"),
        };
        let (dup, own) = (under("same.txt"), under("only-b.txt"));
        let others = [(ID_COPY.to_string(), OTHER)];
        let got = conflicts_in_dir(&c, &DIR, &others, &[main, dup.clone(), own.clone()], |_| {
            None
        });
        assert_eq!(got.len(), 1, "{got:?}");
        let sc = &got[&dup];
        assert_eq!(sc.shown, b"same (conflict 2026-11-28 K64EJMH).txt");
        assert_eq!(sc.original, b"same.txt");
        assert_eq!(sc.copy.client, SyncClient::Syncthing);
        // A second copy of the ID file that has the name too: the first (by file name) keeps it.
        const THIRD: DirId = DirId([11; 16]);
        let third = match c.encrypt(&THIRD, b"only-b.txt").unwrap() {
            StoredName::Short(s) => s,
            StoredName::Long { .. } => panic!("long"),
        };
        let others = [
            (ID_COPY.to_string(), OTHER),
            ("cloakfs (1).dirid".to_string(), THIRD),
        ];
        let got = conflicts_in_dir(&c, &DIR, &others, &[own, third.clone()], |_| None);
        assert_eq!(got.keys().collect::<Vec<_>>(), [&third]);
        assert_eq!(got[&third].shown, b"only-b (conflict 1).txt");
    }

    #[test]
    fn a_long_copys_sidecar_copies_go_with_it_unless_another_entry_needs_them() {
        let h = "H".repeat(43);
        let long = format!("cloakfs.long.{h}");
        let side = format!("{long}.name");
        let copy = |m: &str| format!("cloakfs.long.{m}.{h}");
        let side_copy = |m: &str| format!("{long}.{m}.name");
        let (m1, m2) = (ST, "sync-conflict-20261128-121212-4CTITOD");
        let l = |v: &[&String]| v.iter().map(|s| (*s).clone()).collect::<Vec<_>>();
        // The only entry gone: every copy of its sidecar goes.
        assert_eq!(
            sidecar_copies_left_by(&copy(m1), &l(&[&side_copy(m1), &side_copy(m2)])),
            [side_copy(m1), side_copy(m2)]
        );
        // The original is still there with its own sidecar: the copy's own goes.
        assert_eq!(
            sidecar_copies_left_by(&copy(m1), &l(&[&long, &side, &side_copy(m1)])),
            [side_copy(m1)]
        );
        // Another copy still needs it, and it is the only source of the name: it stays.
        assert!(sidecar_copies_left_by(&copy(m1), &l(&[&copy(m2), &side_copy(m1)])).is_empty());
        // Not a copy of a long name: nothing.
        assert!(
            sidecar_copies_left_by("abc.sync-conflict-20261128-101010-4CTITOD", &[]).is_empty()
        );
    }

    #[test]
    fn sync_clients_copies_of_an_id_file_are_known_and_others_are_not() {
        for n in [
            "cloakfs.sync-conflict-20261128-151500-K64EJMH.dirid",
            "cloakfs (Ann's conflicted copy 2026-11-28).dirid",
            "cloakfs (conflicted copy 2026-11-28 151500).dirid",
            "cloakfs-LAPTOP.dirid",
            "cloakfs (1).dirid",
        ] {
            assert!(is_dir_id_copy(n.as_bytes()), "{n}");
        }
        for n in [
            "cloakfs.dirid",
            "cloakfs.conf",
            "cloakfs.long.abc.name",
            "dirid",
            "x.dirid",
        ] {
            assert!(!is_dir_id_copy(n.as_bytes()), "{n}");
        }
    }

    #[test]
    fn sync_clients_own_files_are_known_and_others_are_not() {
        for n in [
            ".stfolder",
            ".stversions",
            ".dropbox.cache",
            ".sync_1a2b3c.db",
            ".sync_journal.db-wal",
        ] {
            assert!(is_client_metadata(n.as_bytes()), "{n}");
        }
        for n in [".hidden", ".sync_notes.txt", "stfolder", ".stfolder2"] {
            assert!(!is_client_metadata(n.as_bytes()), "{n}");
        }
    }
}
