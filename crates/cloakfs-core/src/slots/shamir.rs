//! `shamir` slots: the KEK is random and split M-of-N with Shamir's secret sharing over GF(256)
//! (the `blahaj` crate); the N shares are given to people (files), never stored in the config.
//! Any M of them rebuild the KEK; M-1 reveal nothing about it.
//!
//! Fields: `threshold` (M, decimal) and `shares` (N, decimal), 1 ≤ M ≤ N ≤ 255.
//!
//! A share is the 60 bytes
//! `version(1) = 1 || volume_id(16) || u32be(slot id) || M(1) || N(1) || x(1) || y(32) || check(4)`
//! where `(x, y)` is the blahaj share (x = 1..N, y = one GF(256) point per KEK byte) and
//! `check` is the first 4 bytes of SHA-256(`"cloakfs share v1"` || the 56 bytes before it). Its
//! text form is `"cloakfs-share:" || b64(60 bytes)`; a share file holds that line, optionally
//! after `#` comment lines. Binding the volume ID and slot ID means that shares of another
//! volume or slot are refused with a clear error instead of silently producing a wrong key.

use super::{Kek, KeySlot};
use crate::error::{Error, Result};
use crate::text::{b64, unb64, Fields};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// Fields of a shamir slot besides the common ones.
pub const FIELDS: &[&str] = &["threshold", "shares"];
/// Version byte of the share encoding.
pub const SHARE_VERSION: u8 = 1;
/// Prefix of a share's text form.
pub const SHARE_PREFIX: &str = "cloakfs-share:";
/// Domain of a share's checksum.
pub const CHECK_DOMAIN: &str = "cloakfs share v1";
/// Length of an encoded share.
pub const SHARE_LEN: usize = 60;

/// One share of a shamir slot's KEK.
#[derive(Clone)]
pub struct Share {
    /// Volume the share belongs to.
    pub volume_id: [u8; 16],
    /// Slot the share belongs to.
    pub slot_id: u32,
    /// Shares needed (M).
    pub threshold: u8,
    /// Shares made (N).
    pub total: u8,
    /// This share's x coordinate, 1..=N.
    pub index: u8,
    y: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Share(slot {}, {} of {}, threshold {})",
            self.slot_id, self.index, self.total, self.threshold
        )
    }
}

fn check(body: &[u8]) -> [u8; 4] {
    let d = Sha256::new()
        .chain_update(CHECK_DOMAIN.as_bytes())
        .chain_update(body)
        .finalize();
    [d[0], d[1], d[2], d[3]]
}

impl Share {
    /// A share from its parts (test vectors).
    pub fn from_parts(
        volume_id: [u8; 16],
        slot_id: u32,
        threshold: u8,
        total: u8,
        index: u8,
        y: &[u8; 32],
    ) -> Self {
        Self {
            volume_id,
            slot_id,
            threshold,
            total,
            index,
            y: Zeroizing::new(*y),
        }
    }

    /// The text form, `cloakfs-share:<b64>`.
    pub fn encode(&self) -> Zeroizing<String> {
        let mut b = Zeroizing::new(Vec::with_capacity(SHARE_LEN));
        b.push(SHARE_VERSION);
        b.extend_from_slice(&self.volume_id);
        b.extend_from_slice(&self.slot_id.to_be_bytes());
        b.extend_from_slice(&[self.threshold, self.total, self.index]);
        b.extend_from_slice(&self.y[..]);
        let c = check(&b);
        b.extend_from_slice(&c);
        Zeroizing::new(format!("{SHARE_PREFIX}{}", b64(&b)))
    }

    /// The content of a share file: a comment line saying what it is, then the share.
    pub fn file_text(&self) -> Zeroizing<String> {
        Zeroizing::new(format!(
            "# cloakfs key share {} of {}: any {} of them open key slot {} of volume {}\n{}\n",
            self.index,
            self.total,
            self.threshold,
            self.slot_id,
            b64(&self.volume_id),
            self.encode().as_str()
        ))
    }

    /// Reads a share from a share file's content (comment lines and blank lines ignored).
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |m: &str| Error::InvalidSecret(format!("not a valid cloakfs key share: {m}"));
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .ok_or_else(|| bad("it is empty"))?;
        let body = line
            .strip_prefix(SHARE_PREFIX)
            .ok_or_else(|| bad(&format!("it does not start with {SHARE_PREFIX}")))?;
        let b = Zeroizing::new(unb64(body.as_bytes()).ok_or_else(|| bad("bad base64url"))?);
        match b.first() {
            Some(&SHARE_VERSION) => {}
            Some(&v) => {
                return Err(Error::UnsupportedVersion {
                    what: "key share",
                    found: v.into(),
                    supported: SHARE_VERSION.into(),
                })
            }
            None => return Err(bad("it is empty")),
        }
        if b.len() != SHARE_LEN {
            return Err(bad("wrong length (truncated?)"));
        }
        if check(&b[..SHARE_LEN - 4]) != b[SHARE_LEN - 4..] {
            return Err(bad("checksum mismatch (damaged or mistyped)"));
        }
        let share = Self {
            volume_id: b[1..17].try_into().expect("16"),
            slot_id: u32::from_be_bytes(b[17..21].try_into().expect("4")),
            threshold: b[21],
            total: b[22],
            index: b[23],
            y: Zeroizing::new(b[24..56].try_into().expect("32")),
        };
        if share.threshold == 0 || share.threshold > share.total {
            return Err(bad("threshold out of range"));
        }
        if share.index == 0 || share.index > share.total {
            return Err(bad("index out of range"));
        }
        Ok(share)
    }
}

/// Checks M and N: 1 ≤ M ≤ N ≤ 255.
pub fn check_m_of_n(m: u32, n: u32) -> Result<(u8, u8)> {
    if !(1..=255).contains(&n) || m == 0 || m > n {
        return Err(Error::Refused(format!(
            "invalid share scheme {m}/{n}: need 1 <= M <= N <= 255"
        )));
    }
    Ok((m as u8, n as u8))
}

/// Splits `kek` into `n` shares, any `m` of which rebuild it.
pub fn split(kek: &Kek, volume_id: [u8; 16], slot_id: u32, m: u8, n: u8) -> Result<Vec<Share>> {
    check_m_of_n(m.into(), n.into())?;
    let dealer = blahaj::Sharks(m).dealer(kek.expose());
    let shares = dealer
        .take(n as usize)
        .map(|s| {
            let raw = Zeroizing::new(Vec::from(&s));
            let y: [u8; 32] = raw[1..].try_into().expect("32-byte secret");
            let share = Share::from_parts(volume_id, slot_id, m, n, raw[0], &y);
            let mut y = y;
            zeroize::Zeroize::zeroize(&mut y);
            share
        })
        .collect();
    Ok(shares)
}

/// Fields, KEK and shares of a new shamir slot `slot_id` (the ID the config gives its next
/// slot, `VolumeConfig::next_slot_id`).
pub fn new_slot(
    volume_id: [u8; 16],
    slot_id: u32,
    m: u8,
    n: u8,
) -> Result<(Fields, Kek, Vec<Share>)> {
    let kek = Kek::random();
    let shares = split(&kek, volume_id, slot_id, m, n)?;
    let mut f = Fields::new();
    f.insert("threshold".into(), m.to_string());
    f.insert("shares".into(), n.to_string());
    Ok((f, kek, shares))
}

/// Combines the shares that belong to `slot` (of the volume `volume_id`): `None` if none
/// does; an error if fewer than the threshold do, or if they disagree with the slot.
pub fn kek(slot: &KeySlot, volume_id: &[u8; 16], shares: &[Share]) -> Result<Option<Kek>> {
    let mine: Vec<&Share> = shares
        .iter()
        .filter(|s| &s.volume_id == volume_id && s.slot_id == slot.id())
        .collect();
    if mine.is_empty() {
        return Ok(None);
    }
    let (m, n) = check_m_of_n(slot.num("threshold")?, slot.num("shares")?)
        .map_err(|e| Error::ConfigDamaged(format!("slot {}: {e}", slot.id())))?;
    let mut distinct: Vec<&Share> = Vec::new();
    for s in mine {
        if s.threshold != m || s.total != n {
            return Err(Error::InvalidSecret(format!(
                "a share says {}-of-{} but slot {} is {m}-of-{n}",
                s.threshold,
                s.total,
                slot.id()
            )));
        }
        match distinct.iter().find(|d| d.index == s.index) {
            Some(d) if d.y[..] != s.y[..] => {
                return Err(Error::InvalidSecret(format!(
                    "two different shares claim to be share {} of slot {}",
                    s.index,
                    slot.id()
                )))
            }
            Some(_) => {}
            None => distinct.push(s),
        }
    }
    if distinct.len() < m as usize {
        return Err(Error::InvalidSecret(format!(
            "{} distinct share(s) of slot {} given, {m} needed",
            distinct.len(),
            slot.id()
        )));
    }
    let parts: Vec<blahaj::Share> = distinct[..m as usize]
        .iter()
        .map(|s| {
            let mut raw = Zeroizing::new(vec![s.index]);
            raw.extend_from_slice(&s.y[..]);
            blahaj::Share::try_from(&raw[..]).expect("33 bytes")
        })
        .collect();
    let secret = Zeroizing::new(
        blahaj::Sharks(m)
            .recover(&parts)
            .map_err(|e| Error::InvalidSecret(format!("cannot combine shares: {e}")))?,
    );
    let k: [u8; 32] = secret[..]
        .try_into()
        .map_err(|_| Error::InvalidSecret("shares do not hold a 32-byte key".into()))?;
    Ok(Some(Kek::from_slice(&k)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(id: u32, m: u8, n: u8) -> KeySlot {
        let mut f = Fields::new();
        f.insert("id".into(), id.to_string());
        f.insert("threshold".into(), m.to_string());
        f.insert("shares".into(), n.to_string());
        KeySlot { fields: f }
    }

    #[test]
    fn any_m_of_n_and_not_fewer() {
        let vid = [9u8; 16];
        let (_, kek, shares) = new_slot(vid, 3, 3, 5).unwrap();
        let s = slot(3, 3, 5);
        let parsed: Vec<Share> = shares
            .iter()
            .map(|sh| Share::parse(&sh.file_text()).unwrap())
            .collect();
        for combo in [[0, 1, 2], [0, 3, 4], [4, 2, 1], [1, 3, 4]] {
            let pick: Vec<Share> = combo.iter().map(|&i| parsed[i].clone()).collect();
            let got = kek_of(&s, &vid, &pick).unwrap().unwrap();
            assert_eq!(got.expose(), kek.expose());
        }
        let two = [parsed[0].clone(), parsed[4].clone()];
        assert!(kek_of(&s, &vid, &two)
            .unwrap_err()
            .to_string()
            .contains("3 needed"));
        // The same share twice still counts once.
        let dup = [parsed[0].clone(), parsed[0].clone(), parsed[1].clone()];
        assert!(kek_of(&s, &vid, &dup).is_err());
        // Shares of another volume or slot are not used.
        assert!(kek_of(&s, &[1u8; 16], &parsed).unwrap().is_none());
        assert!(kek_of(&slot(4, 3, 5), &vid, &parsed).unwrap().is_none());
    }

    fn kek_of(s: &KeySlot, vid: &[u8; 16], shares: &[Share]) -> Result<Option<Kek>> {
        kek(s, vid, shares)
    }

    #[test]
    fn damaged_and_foreign_encodings() {
        let sh = Share::from_parts([1; 16], 2, 2, 3, 1, &[7; 32]);
        let text = sh.encode();
        assert_eq!(text.len(), SHARE_PREFIX.len() + 80);
        let back = Share::parse(&text).unwrap();
        assert_eq!((back.slot_id, back.index, back.threshold), (2, 1, 2));
        let mut chars: Vec<char> = text.chars().collect();
        let i = SHARE_PREFIX.len() + 40;
        chars[i] = if chars[i] == 'A' { 'B' } else { 'A' };
        let typo: String = chars.into_iter().collect();
        assert!(Share::parse(&typo)
            .unwrap_err()
            .to_string()
            .contains("checksum"));
        assert!(Share::parse("hello").is_err());
        assert!(Share::parse(&text[..text.len() - 4]).is_err());
        assert!(check_m_of_n(3, 2).is_err());
        assert!(check_m_of_n(0, 2).is_err());
        assert!(check_m_of_n(2, 256).is_err());
    }
}
