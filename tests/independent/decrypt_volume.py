#!/usr/bin/env python3
"""Independent decryptor for cloakfs volumes (format version 1).

Written from docs/FORMAT.md alone (no code shared with the Rust implementation), to show that the
document is complete and to catch drift between it and the code.

    decrypt_volume.py [--config FILE] [SECRETS] CIPHERDIR OUTDIR
    decrypt_volume.py [--config FILE] CIPHERDIR PASSFILE OUTDIR
    decrypt_volume.py --self-test

SECRETS, one or more of (as the same options of `cloakfs`):
    --passfile FILE           a passphrase slot: the first line of FILE (without its line feed
                              and a carriage return before it)
    --keyfile FILE            a keyfile slot: every byte of FILE
    --recovery-key-file FILE  a recovery slot: the typeable recovery key in FILE
    --share FILE              a shamir slot (repeat M times); an age-encrypted share file also
                              needs the --identity that decrypts it
    --identity FILE           a recipient slot: an age X25519 identity file (repeatable)

The slots are tried in config order with the secrets given (FORMAT.md 5.1); the one that opens
is reported on standard output. OUTDIR must not exist or be empty; the whole plaintext tree is
written there (regular files, directories, symlinks; fifos are recreated, sockets and device
nodes are reported and skipped). A volume in a sync folder decrypts whole: sync clients'
conflict copies under the names of section 2.1, and the entries of a directory with copies of
its ID file (section 9.2) under the names of that section.

The config MAC is verified before anything else is decrypted, and every block, name and symlink
target must authenticate. Exit status: 0 on success, 1 on any error (wrong secret, damaged or
tampered volume, unsupported version: one line on stderr), 2 on a usage error. On error OUTDIR
may hold a partial tree.

Needs the `cryptography`, `argon2-cffi` and `pyrage` (age-encryption.org/v1, for recipient slots
and age-encrypted share files) packages.
"""

import argparse
import base64
import hashlib
import hmac
import io
import json
import os
import stat
import struct
import sys

from argon2.low_level import Type, hash_secret_raw
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESGCMSIV, AESSIV, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF


class VolumeError(Exception):
    """Anything that makes the volume (or one of its entries) unusable."""


class EntryError(VolumeError):
    """A VolumeError already prefixed with the backing path it concerns."""


# --------------------------------------------------------------------------------------------
# Section 1: encodings and primitives

B64_ALPHABET = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64(text, what: str, length=None) -> bytes:
    """Strict unpadded base64url: alphabet only, no padding, canonical trailing bits."""
    if isinstance(text, str):
        try:
            text = text.encode("ascii")
        except UnicodeEncodeError:
            raise VolumeError(f"{what}: not base64url")
    if any(c not in B64_ALPHABET for c in text) or len(text) % 4 == 1:
        raise VolumeError(f"{what}: not base64url")
    raw = base64.urlsafe_b64decode(text + b"=" * (-len(text) % 4))
    if b64(raw).encode("ascii") != text:
        raise VolumeError(f"{what}: non-canonical base64url")
    if length is not None and len(raw) != length:
        raise VolumeError(f"{what}: expected {length} bytes, got {len(raw)}")
    return raw


def hkdf(ikm: bytes, salt, info: bytes, length: int) -> bytes:
    # salt=None is the RFC 5869 default: HashLen zero bytes.
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def _rotl(v, c):
    return ((v << c) & 0xFFFFFFFF) | (v >> (32 - c))


def hchacha20(key: bytes, nonce16: bytes) -> bytes:
    """HChaCha20 (draft-irtf-cfrg-xchacha-03 section 2.2)."""
    s = list(struct.unpack("<4I", b"expand 32-byte k"))
    s += list(struct.unpack("<8I", key)) + list(struct.unpack("<4I", nonce16))

    def qr(a, b, c, d):
        s[a] = (s[a] + s[b]) & 0xFFFFFFFF
        s[d] = _rotl(s[d] ^ s[a], 16)
        s[c] = (s[c] + s[d]) & 0xFFFFFFFF
        s[b] = _rotl(s[b] ^ s[c], 12)
        s[a] = (s[a] + s[b]) & 0xFFFFFFFF
        s[d] = _rotl(s[d] ^ s[a], 8)
        s[c] = (s[c] + s[d]) & 0xFFFFFFFF
        s[b] = _rotl(s[b] ^ s[c], 7)

    for _ in range(10):
        qr(0, 4, 8, 12)
        qr(1, 5, 9, 13)
        qr(2, 6, 10, 14)
        qr(3, 7, 11, 15)
        qr(0, 5, 10, 15)
        qr(1, 6, 11, 12)
        qr(2, 7, 8, 13)
        qr(3, 4, 9, 14)
    return struct.pack("<8I", *(s[0:4] + s[12:16]))


class XChaCha20Poly1305:
    """XChaCha20-Poly1305 from HChaCha20 and the IETF ChaCha20-Poly1305 (draft section 2.3)."""

    def __init__(self, key: bytes):
        self.key = key

    def _inner(self, nonce: bytes):
        if len(nonce) != 24:
            raise ValueError("XChaCha20-Poly1305 nonce must be 24 bytes")
        return ChaCha20Poly1305(hchacha20(self.key, nonce[:16])), b"\0" * 4 + nonce[16:]

    def encrypt(self, nonce, data, aad):
        aead, n = self._inner(nonce)
        return aead.encrypt(n, data, aad)

    def decrypt(self, nonce, data, aad):
        aead, n = self._inner(nonce)
        return aead.decrypt(n, data, aad)


# --------------------------------------------------------------------------------------------
# Sections 3-6: config, slots, MAC

CONFIG_FILE = "cloakfs.conf"
CONFIG_MAX = 1 << 20
VOLUME_FIELDS = {
    "format_version", "volume_id", "content_cipher", "name_cipher",
    "block_size", "long_name_max", "holes", "plaintext_entries",
}
KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


def check_field_map(m, what):
    if not isinstance(m, dict):
        raise VolumeError(f"damaged config: {what} is not an object")
    for k, v in m.items():
        if not isinstance(v, str):
            raise VolumeError(f"damaged config: {what}.{k} is not a string")
        if not k or any(c not in KEY_CHARS for c in k) or "\n" in v or "\0" in v:
            raise VolumeError(f"damaged config: malformed field {k!r} in {what}")


def number(m, key, what, lo=None, hi=None) -> int:
    if key not in m:
        raise VolumeError(f"damaged config: missing field {what}.{key}")
    v = m[key]
    if not v or not all("0" <= c <= "9" for c in v) or (len(v) > 1 and v[0] == "0"):
        raise VolumeError(f"damaged config: {what}.{key} is not a number")
    n = int(v)
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        raise VolumeError(f"damaged config: {what}.{key} = {n} out of range")
    return n


def field(m, key, what) -> str:
    if key not in m:
        raise VolumeError(f"damaged config: missing field {what}.{key}")
    return m[key]


class Config:
    def __init__(self, text: str):
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise VolumeError(f"damaged config: not valid JSON ({e})")
        if not isinstance(doc, dict):
            raise VolumeError("damaged config: not a JSON object")
        version = doc.get("cloakfs")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise VolumeError('damaged config: missing "cloakfs" version')
        if version != 1:
            raise VolumeError(f"unsupported config version {version} (this decryptor supports 1)")
        if set(doc) != {"cloakfs", "volume", "slots", "mac"}:
            raise VolumeError(f"damaged config: top-level members {sorted(doc)}")
        vol = doc["volume"]
        check_field_map(vol, "volume")
        if not isinstance(doc["slots"], list):
            raise VolumeError("damaged config: slots is not an array")
        for i, s in enumerate(doc["slots"]):
            check_field_map(s, f"slots[{i}]")
        if not isinstance(doc["mac"], str):
            raise VolumeError("damaged config: mac is not a string")

        unknown = set(vol) - VOLUME_FIELDS
        if unknown:
            raise VolumeError(f"damaged config: unknown volume field(s) {sorted(unknown)}")
        fv = number(vol, "format_version", "volume")
        if fv != 1:
            raise VolumeError(f"unsupported volume format version {fv} (this decryptor supports 1)")
        self.volume = vol
        self.volume_id = unb64(field(vol, "volume_id", "volume"), "volume_id", 16)
        self.content_cipher = field(vol, "content_cipher", "volume")
        if self.content_cipher not in ("aes-256-gcm", "xchacha20-poly1305", "aes-256-gcm-siv",
                                       "aes-256-xts"):
            raise VolumeError(f"damaged config: unknown content cipher {self.content_cipher!r}")
        if field(vol, "name_cipher", "volume") != "aes-256-siv":
            raise VolumeError("damaged config: unknown name cipher")
        self.block_size = number(vol, "block_size", "volume", 512, 1 << 20)
        if self.block_size & (self.block_size - 1):
            raise VolumeError("damaged config: block_size is not a power of two")
        self.long_name_max = number(vol, "long_name_max", "volume", 62, 255)
        holes = field(vol, "holes", "volume")
        if holes not in ("sparse", "strict"):
            raise VolumeError(f"damaged config: unknown holes mode {holes!r}")
        self.strict = holes == "strict"
        if self.strict and self.content_cipher == "aes-256-xts":
            raise VolumeError("damaged config: strict holes with aes-256-xts")
        # Section 21: a converted adopted tree has no plaintext entry, like any volume.
        entries = vol.get("plaintext_entries")
        if entries in ("adopted", "listed"):
            raise VolumeError("an adopted tree with plaintext entries left (section 21) "
                              "is not supported")
        if entries not in (None, "converted"):
            raise VolumeError(f"damaged config: unknown plaintext_entries mode {entries!r}")

        self.slots = doc["slots"]
        ids = set()
        for i, s in enumerate(self.slots):
            sid = number(s, "id", f"slots[{i}]", 0, 2**32 - 1)
            field(s, "kind", f"slots[{i}]")
            if sid in ids:
                raise VolumeError(f"damaged config: duplicate slot id {sid}")
            ids.add(sid)
        self.mac = unb64(doc["mac"], "mac", 32)

    def wrap_aad(self, slot) -> bytes:
        text = "cloakfs slot v1\n" + f"volume_id={self.volume['volume_id']}\n"
        for k in sorted(slot):
            if k != "wrapped":
                text += f"{k}={slot[k]}\n"
        return text.encode("utf-8")

    def canonical(self) -> bytes:
        text = "cloakfs config v1\n"
        for k in sorted(self.volume):
            text += f"volume.{k}={self.volume[k]}\n"
        for i, slot in enumerate(self.slots):
            for k in sorted(slot):
                text += f"slot.{i}.{k}={slot[k]}\n"
        return text.encode("utf-8")

    def slot_by_id(self, slot_id: int):
        for s in self.slots:
            if s["id"] == str(slot_id):
                return s
        return None

    def unlock(self, secrets: "Secrets"):
        """Section 5.1: returns (master key, opening slot) after verifying the MAC."""
        first_error = None
        tried = False
        for slot in self.slots:
            kind = slot["kind"]
            what = f"slot {slot['id']} ({kind})"
            if kind not in SLOT_KINDS:
                continue
            try:
                kek = SLOT_KINDS[kind](self, slot, what, secrets)
                if kek is None:
                    continue
                wrapped = unb64(field(slot, "wrapped", what), f"{what}.wrapped", 60)
            except VolumeError as e:
                first_error = first_error or e
                continue
            tried = True
            try:
                mk = AESGCM(kek).decrypt(wrapped[:12], wrapped[12:], self.wrap_aad(slot))
            except InvalidTag:
                continue
            key = hkdf(mk, self.volume_id, b"cloakfs v1 config-mac", 32)
            mac = hmac.new(key, self.canonical(), hashlib.sha256).digest()
            if not hmac.compare_digest(mac, self.mac):
                raise VolumeError("config was modified without the key (MAC mismatch)")
            return mk, slot
        if first_error is not None:
            raise first_error
        if tried:
            raise VolumeError("wrong secret: no key slot accepts the secrets given")
        kinds = ", ".join(s["kind"] for s in self.slots) or "none"
        raise VolumeError(f"no key slot takes the secrets given (the slots: {kinds})")


# --------------------------------------------------------------------------------------------
# Section 5.2-5.6: the KEK of each slot kind (None: no secret for that slot)

class Secrets:
    def __init__(self):
        self.passphrase = None   # bytes
        self.keyfile = None      # bytes
        self.recovery = None     # 32 bytes
        self.identities = []     # age identities
        self.shares = []         # (file name, Share)


def kek_passphrase(config, slot, what, secrets):
    if secrets.passphrase is None:
        return None
    m = number(slot, "argon2_memory_kib", what, 64, 4 * 1024 * 1024)
    t = number(slot, "argon2_iterations", what, 1, 1000)
    p = number(slot, "argon2_lanes", what, 1, 64)
    if m < 8 * p:
        raise VolumeError(f"damaged config: {what}: memory below 8 KiB per lane")
    if field(slot, "kdf", what) != "argon2id":
        raise VolumeError(f"unsupported kdf {slot['kdf']!r} in {what}")
    salt = unb64(field(slot, "salt", what), f"{what}.salt", 32)
    return hash_secret_raw(secrets.passphrase, salt, time_cost=t, memory_cost=m,
                           parallelism=p, hash_len=32, type=Type.ID, version=19)


def kek_keyfile(config, slot, what, secrets):
    if secrets.keyfile is None:
        return None
    salt = unb64(field(slot, "salt", what), f"{what}.salt", 32)
    return hkdf(secrets.keyfile, salt, b"cloakfs v1 slot keyfile", 32)


def kek_recovery(config, slot, what, secrets):
    if secrets.recovery is None:
        return None
    salt = unb64(field(slot, "salt", what), f"{what}.salt", 32)
    return hkdf(secrets.recovery, salt, b"cloakfs v1 slot recovery", 32)


def kek_recipient(config, slot, what, secrets):
    if not secrets.identities:
        return None
    data = unb64(field(slot, "age", what), f"{what}.age")
    if not 1 <= len(data) <= 1 << 20:
        raise VolumeError(f"damaged config: {what}.age is not 1 byte to 1 MiB")
    kek = age_decrypt(data, secrets.identities, what)
    if kek is None:
        return None
    if len(kek) != 32:
        raise VolumeError(f"damaged config: {what}: the age file does not hold a 32-byte key")
    return kek


def kek_shamir(config, slot, what, secrets):
    sid = int(slot["id"])
    mine = [(n, sh) for n, sh in secrets.shares
            if sh.volume_id == config.volume_id and sh.slot_id == sid]
    if not mine:
        return None
    m = number(slot, "threshold", what, 1, 255)
    n_shares = number(slot, "shares", what, 1, 255)
    if m > n_shares:
        raise VolumeError(f"damaged config: {what}: threshold {m} > shares {n_shares}")
    distinct = {}
    for name, sh in mine:
        if (sh.m, sh.n) != (m, n_shares):
            raise VolumeError(f"share file {name} says {sh.m} of {sh.n}, "
                              f"but {what} is {m} of {n_shares}")
        if sh.x in distinct and distinct[sh.x].y != sh.y:
            raise VolumeError(f"share file {name}: another share given is also share {sh.x}")
        distinct.setdefault(sh.x, sh)
    if len(distinct) < m:
        raise VolumeError(f"{len(distinct)} distinct share(s) of slot {sid} given, {m} needed")
    return shamir_combine(list(distinct.values())[:m])


SLOT_KINDS = {
    "passphrase": kek_passphrase,
    "keyfile": kek_keyfile,
    "recovery": kek_recovery,
    "recipient": kek_recipient,
    "shamir": kek_shamir,
}


# -- section 5.4: the typeable recovery key --
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def parse_recovery_key(text: str) -> bytes:
    values = []
    for c in text:
        if c == "-" or c.isspace():
            continue
        if not c.isascii():
            raise VolumeError("invalid recovery key: a character is not in the alphabet")
        c = {"O": "0", "I": "1", "L": "1"}.get(c.upper(), c.upper())
        if c not in CROCKFORD:
            raise VolumeError("invalid recovery key: a character is not in the alphabet")
        values.append(CROCKFORD.index(c))
    if len(values) != 56:
        raise VolumeError(f"invalid recovery key: {len(values)} symbols instead of 56")
    n = 0
    for v in values:
        n = (n << 5) | v
    raw = n.to_bytes(35, "big")
    key, check = raw[:32], raw[32:]
    if hashlib.sha256(b"cloakfs recovery key v1" + key).digest()[:3] != check:
        raise VolumeError("invalid recovery key: checksum mismatch (a typo?)")
    return key


def encode_recovery_key(key: bytes) -> str:
    raw = key + hashlib.sha256(b"cloakfs recovery key v1" + key).digest()[:3]
    n = int.from_bytes(raw, "big")
    symbols = "".join(CROCKFORD[(n >> (5 * (55 - i))) & 31] for i in range(56))
    return "-".join(symbols[i:i + 4] for i in range(0, 56, 4))


# -- section 5.5: age files (age-encryption.org/v1), read with the `pyrage` package --
AGE_ARMOR = b"-----BEGIN AGE ENCRYPTED FILE-----"


def load_identities(data: bytes, name: str):
    import pyrage
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise VolumeError(f"identity file {name} is not text")
    ids = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not line.startswith("AGE-SECRET-KEY-1"):
            raise VolumeError(f"identity file {name}: only age X25519 identities "
                              "(AGE-SECRET-KEY-1...) are supported by this decryptor")
        try:
            ids.append(pyrage.x25519.Identity.from_str(line))
        except Exception:
            raise VolumeError(f"identity file {name}: not a valid age identity")
    if not ids:
        raise VolumeError(f"identity file {name} holds no identity")
    return ids


def age_decrypt(data: bytes, identities, what: str):
    """Decrypts a binary or ASCII-armored age file; None if no identity is a recipient."""
    import pyrage
    try:
        return pyrage.decrypt(data, identities)
    except pyrage.DecryptError as e:
        if "no matching keys" in str(e).lower():
            return None
        raise VolumeError(f"{what}: not a valid age file ({e})")


# -- section 5.6: Shamir shares over GF(2^8) modulo 0x11d --
GF_POLY = 0x11D


def gf_mul(a: int, b: int) -> int:
    r = 0
    while b:
        if b & 1:
            r ^= a
        b >>= 1
        a <<= 1
        if a & 0x100:
            a ^= GF_POLY
    return r


def gf_inv(a: int) -> int:
    # a^254 = a^-1 in GF(2^8)
    r, e = 1, 254
    while e:
        if e & 1:
            r = gf_mul(r, a)
        a = gf_mul(a, a)
        e >>= 1
    return r


class Share:
    def __init__(self, raw: bytes):
        self.volume_id = raw[1:17]
        self.slot_id = struct.unpack(">I", raw[17:21])[0]
        self.m, self.n, self.x = raw[21], raw[22], raw[23]
        self.y = raw[24:56]


def parse_share_file(data: bytes, name: str, identities) -> Share:
    if len(data) > 64 * 1024:
        raise VolumeError(f"share file {name} is larger than 64 KiB")
    if data.startswith(AGE_ARMOR):
        if not identities:
            raise VolumeError(f"share file {name} is encrypted with age: give --identity")
        plain = age_decrypt(data, identities, f"share file {name}")
        if plain is None:
            raise VolumeError(f"share file {name}: none of the identities given decrypts it")
        data = plain
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise VolumeError(f"share file {name} is not text")
    lines = [ln.strip() for ln in text.split("\n")]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if not lines or not lines[0].startswith("cloakfs-share:"):
        raise VolumeError(f"share file {name}: not a cloakfs key share")
    raw = unb64(lines[0][len("cloakfs-share:"):], f"share file {name}")
    if raw and raw[0] != 1:
        raise VolumeError(f"share file {name}: unsupported key share version {raw[0]}")
    if len(raw) != 60:
        raise VolumeError(f"share file {name}: not 60 bytes")
    if hashlib.sha256(b"cloakfs share v1" + raw[:56]).digest()[:4] != raw[56:]:
        raise VolumeError(f"share file {name}: checksum mismatch (damaged or mistyped)")
    sh = Share(raw)
    if not 1 <= sh.m <= sh.n or not 1 <= sh.x <= sh.n:
        raise VolumeError(f"share file {name}: threshold or index out of range")
    return sh


def shamir_combine(shares) -> bytes:
    """Lagrange interpolation at 0, byte by byte (FORMAT.md 5.6)."""
    out = bytearray(32)
    for i in range(32):
        acc = 0
        for sj in shares:
            lj = 1
            for sm in shares:
                if sm.x != sj.x:
                    lj = gf_mul(lj, gf_mul(sm.x, gf_inv(sm.x ^ sj.x)))
            acc ^= gf_mul(lj, sj.y[i])
        out[i] = acc
    return bytes(out)


def check_shares(config: Config, secrets: Secrets):
    """FORMAT.md 5.6, check 3: every share belongs to this volume and to one of its shamir slots."""
    for name, sh in secrets.shares:
        if sh.volume_id != config.volume_id:
            raise VolumeError(f"share file {name} belongs to another volume "
                              f"(ID {b64(sh.volume_id)})")
        slot = config.slot_by_id(sh.slot_id)
        if slot is None or slot["kind"] != "shamir":
            raise VolumeError(f"share file {name} is for key slot {sh.slot_id}, "
                              "which is not a shamir slot of this volume")


# --------------------------------------------------------------------------------------------
# Sections 7-11: keys, contents, names, symlinks

HEADER_LEN = 18
XTS_HEADER_XATTR = "user.cloakfs.id"


def xts_keys(k_content: bytes, file_id: bytes):
    return (hkdf(k_content, None, b"cloakfs v1 xts-file" + file_id, 64),
            hkdf(k_content, None, b"cloakfs v1 xts-short" + file_id, 32))


def xts_unit(pair: bytes, short: bytes, n: int, unit: bytes, encrypt: bool,
             tail_counter: bytes = b"") -> bytes:
    """Block n of an aes-256-xts file (FORMAT.md section 20), either direction; a short block
    starts from the header's counter block T (version 2) or u128le(n) (version 1)."""
    tweak = n.to_bytes(16, "little")
    if len(unit) < 16:
        cipher = Cipher(algorithms.AES(short), modes.CTR(tail_counter or tweak))
    else:
        cipher = Cipher(algorithms.AES(pair), modes.XTS(tweak))
    op = cipher.encryptor() if encrypt else cipher.decryptor()
    return op.update(unit) + op.finalize()


def xts_decrypt(k_content: bytes, file_id: bytes, bs: int, data: bytes,
                tail_counter: bytes = b"") -> bytes:
    pair, short = xts_keys(k_content, file_id)
    out = bytearray()
    for n, pos in enumerate(range(0, len(data), bs)):
        unit = data[pos:pos + bs]
        if len(unit) == bs and unit.count(0) == bs:
            out += unit  # a hole
        else:
            out += xts_unit(pair, short, n, unit, encrypt=False, tail_counter=tail_counter)
    return bytes(out)


class Volume:
    def __init__(self, config: Config, mk: bytes):
        c = config
        self.c = c
        sub = lambda label, n: hkdf(mk, c.volume_id, b"cloakfs v1 " + label, n)  # noqa: E731
        self.k_content = sub(b"content", 32)
        self.k_names = sub(b"names", 64)
        self.k_xattr_names = sub(b"xattr-names", 64)
        self.k_metadata = sub(b"metadata", 32)
        self.xts = c.content_cipher == "aes-256-xts"
        if c.content_cipher in ("aes-256-gcm", "aes-256-xts"):
            self.nonce_len, self.aead = 12, AESGCM
        elif c.content_cipher == "aes-256-gcm-siv":
            self.nonce_len, self.aead = 12, AESGCMSIV
        else:
            self.nonce_len, self.aead = 24, XChaCha20Poly1305
        self.overhead = self.nonce_len + 16

    # -- section 8 --
    def file_key(self, file_id: bytes) -> bytes:
        return hkdf(self.k_content, None, b"cloakfs v1 file" + file_id, 32)

    def plain_size(self, c: int) -> int:
        bs, o = self.c.block_size, self.overhead
        if c == 0:
            return 0
        if c < HEADER_LEN:
            raise VolumeError("file header truncated")
        q, r = divmod(c - HEADER_LEN, bs + o)
        if r == 0:
            return q * bs
        if r <= o:
            raise VolumeError("last block truncated")
        return q * bs + r - o

    def decrypt_file(self, data: bytes, path: bytes) -> bytes:
        if self.xts:
            return self.decrypt_xts_file(data, path)
        size = self.plain_size(len(data))
        if len(data) == 0:
            return b""
        version = struct.unpack(">H", data[:2])[0]
        if version != 1:
            raise VolumeError(f"unsupported file header version {version}")
        file_id = data[2:HEADER_LEN]
        aead = self.aead(self.file_key(file_id))
        bs, o, n = self.c.block_size, self.overhead, self.nonce_len
        out = bytearray()
        pos, block = HEADER_LEN, 0
        while len(out) < size:
            plen = min(bs, size - len(out))
            sealed = data[pos:pos + plen + o]
            if sealed.count(0) == len(sealed):
                if self.c.strict or plen != bs:
                    raise VolumeError(f"block {block} is all zeros (strict volume)")
                out += bytes(plen)
            else:
                aad = file_id + struct.pack(">Q", block)
                try:
                    out += aead.decrypt(sealed[:n], sealed[n:], aad)
                except InvalidTag:
                    raise VolumeError(f"block {block} failed authentication")
            pos += plen + o
            block += 1
        return bytes(out)

    # -- section 20 --
    def decrypt_xts_file(self, data: bytes, path: bytes) -> bytes:
        if len(data) == 0:
            return b""
        try:
            header = os.getxattr(path, XTS_HEADER_XATTR, follow_symlinks=False)
        except OSError:
            raise VolumeError(f"file has data but no readable {XTS_HEADER_XATTR} xattr")
        version = struct.unpack(">H", header[:2])[0] if len(header) >= 2 else None
        if version not in (1, 2):
            raise VolumeError(f"unsupported file header version {version}")
        want = HEADER_LEN if version == 1 else HEADER_LEN + 16
        if len(header) != want:
            raise VolumeError(f"{XTS_HEADER_XATTR} of version {version} is not {want} bytes")
        tail_counter = header[HEADER_LEN:]
        return xts_decrypt(self.k_content, header[2:HEADER_LEN], self.c.block_size, data,
                           tail_counter)

    # -- section 9 --
    @staticmethod
    def valid_name(name: bytes) -> bool:
        return 1 <= len(name) <= 255 and name not in (b".", b"..") \
            and b"/" not in name and b"\0" not in name

    def decrypt_name(self, dir_id: bytes, enc: bytes) -> bytes:
        sealed = unb64(enc, "encrypted name")
        if len(sealed) <= 16:
            raise VolumeError("encrypted name too short")
        try:
            name = AESSIV(self.k_names).decrypt(sealed, [dir_id])
        except InvalidTag:
            raise VolumeError("name does not decrypt in this directory")
        if not self.valid_name(name):
            raise VolumeError("decrypted name is not a valid name")
        return name

    # -- section 10 --
    def decrypt_symlink(self, target: bytes, root: bytes) -> bytes:
        """`target` of a backing symlink; `root` is the cipher directory (section 10.1)."""
        long = target.startswith(b"cloakfs.symlink.")
        if long:
            h = target[len(b"cloakfs.symlink."):]
            if len(h) != 43:
                raise VolumeError("long symlink target name is not 43 characters")
            unb64(h, "long symlink target name", 32)
            try:
                sealed = read_regular(os.path.join(root, b"cloakfs.symlinks", h),
                                      "long symlink target")
            except FileNotFoundError:
                raise VolumeError("long symlink target is missing")
            if b64(hashlib.sha256(sealed).digest()).encode() != h:
                raise VolumeError("long symlink target does not match its name")
        else:
            sealed = unb64(target, "symlink target")
        if len(sealed) < 28:
            raise VolumeError("symlink target too short")
        try:
            plain = AESGCM(self.k_metadata).decrypt(sealed[:12], sealed[12:], b"symlink")
        except InvalidTag:
            raise VolumeError("symlink target does not authenticate")
        if not 0 < len(plain) <= 4095 or (len(plain) > 3000) != long:
            raise VolumeError("symlink target not in its one stored form")
        return plain

    # -- section 11 (not used for the tree: git stores no xattrs; kept for completeness) --
    def decrypt_xattr(self, stored_name: bytes, value: bytes):
        if not stored_name.startswith(b"user."):
            return stored_name, value
        sealed = unb64(stored_name[5:], "xattr name")
        try:
            name = b"user." + AESSIV(self.k_xattr_names).decrypt(sealed, [b"xattr"])
            plain = AESGCM(self.k_metadata).decrypt(value[:12], value[12:], b"xattr:" + stored_name)
        except InvalidTag:
            raise VolumeError("xattr does not authenticate")
        return name, plain


# --------------------------------------------------------------------------------------------
# Section 2: walking the cipher directory

def classify(name: bytes):
    """Section 2.1: ('long' | 'internal' | 'encrypted')."""
    if name.startswith(b"cloakfs.long."):
        return "internal" if b"." in name[len(b"cloakfs.long."):] else "long"
    if name.startswith(b"cloakfs.") or b"." in name:
        return "internal"
    return "encrypted"


def read_regular(path: bytes, what: str) -> bytes:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise VolumeError(f"{what} is not a regular file")
    with open(path, "rb") as f:
        return f.read()


def long_name_text(path: bytes, entry: bytes, long_name_max: int) -> bytes:
    """Section 9.3: the full encrypted name of long-name entry `entry` from sidecar `path`."""
    text = read_regular(path, "long-name sidecar").rstrip()
    if b"cloakfs.long." + b64(hashlib.sha256(text).digest()).encode() != entry:
        raise VolumeError("long-name sidecar does not match its entry")
    if len(text) <= long_name_max:
        raise VolumeError("long-name entry for a short encrypted name")
    return text


def open_name(vol: "Volume", dir_id: bytes, entry: bytes, sidecar) -> bytes:
    """The plaintext name of backing entry `entry` (class 'long' or 'encrypted') under directory
    ID `dir_id` (sections 9.1, 9.3); `sidecar(entry)` gives a long entry's full name."""
    if classify(entry) == "long":
        enc = sidecar(entry)
    else:
        if len(entry) > vol.c.long_name_max:
            raise VolumeError("encrypted name longer than long_name_max")
        enc = entry
    return vol.decrypt_name(dir_id, enc)


# Section 2.1, "Conflict copies": the markers sync clients put into the name of a copy.

DIGITS = frozenset("0123456789")
DEVICE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
HOST_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _digits(s: str) -> bool:
    return bool(s) and all(c in DIGITS for c in s)


def _is_date(s: str) -> bool:
    return (len(s) == 10 and _digits(s[:4]) and s[4] == "-" and _digits(s[5:7]) and s[7] == "-"
            and _digits(s[8:]))


def _ymd(s: str) -> str:
    return f"{s[:4]}-{s[4:6]}-{s[6:8]}"


def _paren_end(s: str):
    """Index of the `)` closing a `(` just before `s`, nested pairs skipped."""
    depth = 0
    for i, c in enumerate(s):
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                return i
            depth -= 1
    return None


def markers(s: str):
    """Each client marker `s` starts with: (client, length, label parts), in the order of
    section 2.1 (Syncthing, ownCloud before 2.5, Dropbox, Nextcloud, numbered, Resilio,
    OneDrive)."""
    out = []
    if s.startswith(".sync-conflict-"):
        r = s[15:]
        if (len(r) >= 23 and _digits(r[:8]) and r[8] == "-" and _digits(r[9:15]) and r[15] == "-"
                and all(c in DEVICE_CHARS for c in r[16:23])):
            out.append(("Syncthing", 38, [_ymd(r[:8]), r[16:23]]))
    if s.startswith("_conflict-"):
        r = s[10:]
        if len(r) >= 15 and _digits(r[:8]) and r[8] == "-" and _digits(r[9:15]):
            out.append(("ownCloud", 25, [_ymd(r[:8])]))
    if s.startswith(" ("):
        close = _paren_end(s[2:])
        if close is not None:
            inner, length = s[2:2 + close], 2 + close + 1
            if "'s conflicted copy " in inner:
                who, rest = inner.split("'s conflicted copy ", 1)
                if " (" in rest:
                    date, n = rest.split(" (", 1)
                    n = n[:-1] if n.endswith(")") else None
                else:
                    date, n = rest, ""
                if _is_date(date) and n is not None and (n == "" or _digits(n)):
                    out.append(("Dropbox", length, [date, who if n == "" else f"{who} {n}"]))
            elif inner.startswith("conflicted copy "):
                rest = inner[16:]
                user, dt = rest[:-17], rest[-17:]
                if (len(rest) >= 17 and _is_date(dt[:10]) and dt[10] == " "
                        and len(dt[11:]) == 6 and _digits(dt[11:])
                        and (user.endswith(" ") or user == "")):
                    out.append(("Nextcloud", length, [dt[:10]] + ([user[:-1]] if user else [])))
            elif _digits(inner):
                out.append(("numbered", length, [inner]))
    if s.startswith(".Conflict"):
        r = s[9:]
        spaced = r.startswith(" ")
        n = r[1:] if spaced else r
        nd = len(n) - len(n.lstrip("0123456789"))
        if not (spaced and nd == 0):
            out.append(("Resilio", 9 + spaced + nd, [n[:nd]] if nd else []))
    if s.startswith("-"):
        host = 0
        while 1 + host < len(s) and s[1 + host] in HOST_CHARS:
            host += 1
        if host:
            out.append(("OneDrive", 1 + host, [s[1:1 + host]]))
    return out


def conflict_readings(name: bytes):
    """Every reading of backing name `name` as a conflict copy: (original backing name, LABEL),
    positions from the left, then markers in the order of section 2.1."""
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError:
        return
    for at in range(1, len(text)):
        head, tail = text[:at], text[at:]
        for client, length, parts in markers(tail):
            ext = tail[length:]
            if ext and not (ext.startswith(".") and "." not in ext[1:]):
                continue
            if client == "OneDrive" and head.endswith("-"):
                continue
            label = " ".join(parts) if parts else client
            yield (head + ext).encode("utf-8"), label


def conflict_tag(name: bytes) -> str:
    return hashlib.sha256(name).digest()[:3].hex()


def shown_conflict_name(plain: bytes, label: str, tag) -> bytes:
    """`STEM (conflict LABEL[ #TAG])EXT` within 255 bytes (section 2.1)."""
    dot = plain.rfind(b".")
    split = dot if dot > 0 and len(plain) - dot <= 16 else len(plain)
    stem, ext = plain[:split], plain[split:]
    mark = (" (conflict " + label.replace("/", "_") + (f" #{tag}" if tag else "") + ")").encode()
    room = max(0, 255 - len(mark) - len(ext))
    if len(stem) > room:
        stem = stem[:room]
        for _ in range(3):
            try:
                stem.decode("utf-8")
                break
            except UnicodeDecodeError:
                stem = stem[:-1]
    return stem + mark + ext


def is_dir_id_copy(name: bytes) -> bool:
    """Section 9.2: a sync client's copy of `cloakfs.dirid`."""
    return name.startswith(b"cloakfs") and name != b"cloakfs.dirid" and b"dirid" in name


def dir_id_copies(backing: bytes, listing, main: bytes):
    """Section 9.2: the other IDs of a directory, [(copy's file name, ID)] in the order tried."""
    out = []
    for name in listing:  # sorted
        if not is_dir_id_copy(name):
            continue
        try:
            data = read_regular(os.path.join(backing, name), "copy of cloakfs.dirid")
        except OSError:
            continue
        except VolumeError:
            continue
        if len(data) == 16 and data != main and all(data != d for _, d in out):
            out.append((name, data))
    return out


def dir_id_copy_label(name: bytes) -> str:
    """Section 9.2: LABEL of the entries named under ID-file copy `name` that are shown under a
    conflict name: its reading as a copy of `cloakfs.dirid`, else its tag."""
    for original, label in conflict_readings(name):
        if original == b"cloakfs.dirid":
            return label
    return conflict_tag(name)


def list_names(vol: "Volume", backing: bytes, dir_id: bytes, root: bool):
    """The entries of backing directory `backing` (ID `dir_id`) with the names they are listed
    under (sections 2.1, 9.2): [(backing name, plaintext name)] in backing name order."""
    listing = sorted(os.listdir(backing))
    lmax = vol.c.long_name_max

    def sidecar(entry: bytes) -> bytes:
        return long_name_text(os.path.join(backing, entry + b".name"), entry, lmax)

    def sidecar_or_copy(entry: bytes) -> bytes:
        """A long original's full name: from its sidecar, or else from a conflict copy of it."""
        try:
            return sidecar(entry)
        except (VolumeError, OSError) as e:
            first = e
        side = entry + b".name"
        for n in listing:
            if n != side and n.startswith(entry) and any(
                    o == side for o, _ in conflict_readings(n)):
                try:
                    return long_name_text(os.path.join(backing, n), entry, lmax)
                except (VolumeError, OSError):
                    pass
        raise VolumeError(str(first))

    def is_long_entry(name: bytes) -> bool:
        return classify(name) == "long" and len(name) == len(b"cloakfs.long.") + 43

    def as_copy(entry: bytes, under: bytes):
        """Section 2.1: the first accepted reading of `entry` as a conflict copy of a name under
        directory ID `under`."""
        for original, label in conflict_readings(entry):
            kind = classify(original)
            if kind == "internal" or (kind == "long" and not is_long_entry(original)):
                continue
            try:
                return label, open_name(vol, under, original, sidecar_or_copy)
            except (VolumeError, OSError):
                continue
        return None

    others = [] if root else dir_id_copies(backing, listing, dir_id)
    named = {}       # backing name -> plaintext name, under the directory's ID
    pending = []     # (backing name, error): did not decrypt under it (error None: internal)
    for entry in listing:
        where = os.path.join(backing, entry).decode("utf-8", "replace")
        if classify(entry) == "internal":
            pending.append((entry, None))
            continue
        try:
            named[entry] = open_name(vol, dir_id, entry, sidecar)
        except VolumeError as e:
            pending.append((entry, EntryError(f"{where}: {e}")))
        except OSError as e:
            pending.append((entry, EntryError(f"{where}: {e}")))
    copies = []      # (backing name, LABEL, original's plaintext name): shown as conflicts
    under = []       # (index of the ID-file copy, backing name, plaintext name)
    for entry, error in pending:
        reading = as_copy(entry, dir_id)
        if reading is not None:
            copies.append((entry, reading[0], reading[1]))
            continue
        opened = False
        for k, (_, other) in enumerate(others if error is not None else []):
            try:
                under.append((k, entry, open_name(vol, other, entry, sidecar)))
                opened = True
                break
            except (VolumeError, OSError):
                continue
        if opened:
            continue
        # A copy of an entry named under an other ID.
        reading = next((r for r in (as_copy(entry, other) for _, other in others) if r), None)
        if reading is not None:
            copies.append((entry, reading[0], reading[1]))
        elif error is not None:
            raise error
    listed = dict(named)
    taken = set(named.values())
    for k, entry, plain in sorted(under):
        if plain in taken:
            copies.append((entry, dir_id_copy_label(others[k][0]), plain))
        else:
            taken.add(plain)
            listed[entry] = plain
    anywhere = set(named.values()) | {plain for _, _, plain in under}
    untagged = [shown_conflict_name(plain, label, None) for _, label, plain in copies]
    for (entry, label, plain), shown in zip(copies, untagged):
        tagged = untagged.count(shown) > 1 or shown in anywhere
        listed[entry] = shown_conflict_name(plain, label, conflict_tag(entry)) if tagged else shown
    return [(entry, listed[entry]) for entry in listing if entry in listed]


def decrypt_dir(vol: Volume, backing: bytes, dir_id: bytes, out: bytes, counts: dict,
                root: bool = False):
    seen = {}
    for entry, name in list_names(vol, backing, dir_id, root):
        path = os.path.join(backing, entry)
        where = path.decode("utf-8", "replace")
        try:
            if name in seen:
                raise VolumeError(f"two entries are listed under one name ({seen[name]!r})")
            seen[name] = entry
            target = os.path.join(out, name)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                sub_id = read_regular(os.path.join(path, b"cloakfs.dirid"), "cloakfs.dirid")
                if len(sub_id) != 16:
                    raise VolumeError("cloakfs.dirid is not 16 bytes")
                os.mkdir(target)
                counts["dirs"] += 1
                decrypt_dir(vol, path, sub_id, target, counts)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(vol.decrypt_symlink(os.readlink(path), vol.root), target)
                counts["symlinks"] += 1
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    plain = vol.decrypt_file(f.read(), path)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(fd, "wb") as f:
                    f.write(plain)
                counts["files"] += 1
            elif stat.S_ISFIFO(st.st_mode):
                os.mkfifo(target)
                counts["special"] += 1
            else:
                print(f"decrypt_volume: {where}: socket or device node {name!r} skipped",
                      file=sys.stderr)
                counts["special"] += 1
        except EntryError:
            raise
        except VolumeError as e:
            raise EntryError(f"{where}: {e}")


def load_config(config_path: str) -> Config:
    with open(config_path, "rb") as f:
        raw = f.read(CONFIG_MAX + 1)
    if len(raw) > CONFIG_MAX:
        raise VolumeError("config file too large")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise VolumeError("damaged config: not UTF-8")
    return Config(text)


def decrypt_volume(cipherdir: str, config_path: str, secrets: Secrets, outdir: str):
    config = load_config(config_path)
    check_shares(config, secrets)
    mk, slot = config.unlock(secrets)
    vol = Volume(config, mk)
    vol.root = os.fsencode(cipherdir)
    counts = {"dirs": 0, "files": 0, "symlinks": 0, "special": 0}
    decrypt_dir(vol, os.fsencode(cipherdir), config.volume_id, os.fsencode(outdir), counts,
                root=True)
    return counts, slot


# --------------------------------------------------------------------------------------------
# Self-test against FORMAT.md section 15 (covers what the test volume does not: XChaCha20)

def self_test():
    seq = lambda s, n: bytes((s + i) & 255 for i in range(n))  # noqa: E731
    mk, vid, fid = seq(0, 32), seq(0xA0, 16), seq(0xF0, 16)
    k_content = hkdf(mk, vid, b"cloakfs v1 content", 32)
    assert k_content.hex() == "6d756b5d31e7b4dcf816660c544b920f0d110d316fe53e21bf8528476ac50a22"
    fk = hkdf(k_content, None, b"cloakfs v1 file" + fid, 32)
    assert fk.hex() == "408ab56ad7d4d1e160cbee9c5d4e8a72c7f72f6531541126a737621285836d3a"
    aad = fid + struct.pack(">Q", 2)
    plain = b"cloakfs partial block\n"
    n = seq(0x70, 24)
    got = n + XChaCha20Poly1305(fk).encrypt(n, plain, aad)
    assert got.hex() == (
        "707172737475767778797a7b7c7d7e7f8081828384858687fd8079c316f8ac23cc2972e7632c8fd7"
        "71605489e1cddd1d155d61b1d1d1165e762c66ef8135"), got.hex()
    n = seq(0x60, 12)
    got = n + AESGCM(fk).encrypt(n, plain, aad)
    assert got.hex() == (
        "606162636465666768696a6b992139100498b079da3c0b5f1fa694eca3b8fb81806055127fb15fce"
        "433d7683bd8023033240"), got.hex()
    got = n + AESGCMSIV(fk).encrypt(n, plain, aad)
    assert got.hex() == (
        "606162636465666768696a6b2a9f9cdf191536108f4948aeb363d077715f0b42f2c07fc6aabf61a0a3"
        "3b0cfd911692a18f0a"), got.hex()
    self_test_reverse(mk, vid, plain)
    self_test_xts(k_content, fid, plain)
    k_xn = hkdf(mk, vid, b"cloakfs v1 xattr-names", 64)
    k_meta = hkdf(mk, vid, b"cloakfs v1 metadata", 32)
    stored = "user." + b64(AESSIV(k_xn).encrypt(b"comment", [b"xattr"]))
    assert stored == "user.ktqbu3OlLXEsrBpiOowSBHmufY0UbTE", stored
    n = seq(0xB0, 12)
    val = n + AESGCM(k_meta).encrypt(n, b"a plaintext comment", b"xattr:" + stored.encode())
    assert val.hex() == (
        "b0b1b2b3b4b5b6b7b8b9babba1702c8a45ef391ff135881d5daf5c66934d06867ff71665beb0bd0f"
        "ca43837b0428f7"), val.hex()
    self_test_slots(seq, mk)
    print("decrypt_volume: self-test passed")


def self_test_xts(k_content: bytes, fid: bytes, plain: bytes) -> None:
    pair, short = xts_keys(k_content, fid)
    assert pair.hex() == (
        "4c2aeb86fc93341283f02c6904d479666312bb34bed09abb80367440861e8aaf8eac062f49921394d02f9cbb"
        "f1e3b025b645b1929cec98b7ce10d8b72d356b17"), pair.hex()
    assert short.hex() == "37d6d940c6ceafd14cc109f3e0299be0656bc5f67f98104170ba874a8273a353"
    full = xts_unit(pair, short, 0, bytes(i % 251 for i in range(4096)), encrypt=True)
    assert hashlib.sha256(full).hexdigest() == \
        "99e94d028afb2c5ac4fbd813aea173d734425df00dfd3c152802ef8a21012bc9"
    got = xts_unit(pair, short, 2, plain, encrypt=True)
    assert got.hex() == "d6b8dd4ece15efe0b8a618fae80b924b25ad08b71cf3", got.hex()
    got = xts_unit(pair, short, 1, b"tail\n", encrypt=True)
    assert got.hex() == "deedc08a53", got.hex()
    t = bytes.fromhex("00112233445566778899aabbccddeeff")
    got = xts_unit(pair, short, 1, b"tail\n", encrypt=True, tail_counter=t)
    assert got.hex() == "e4dd2d652f", got.hex()
    data = full + bytes(4096) + xts_unit(pair, short, 2, b"tail\n", encrypt=True)
    assert xts_decrypt(k_content, fid, 4096, data) == \
        bytes(i % 251 for i in range(4096)) + bytes(4096) + b"tail\n"


def self_test_reverse(mk: bytes, vid: bytes, plain: bytes) -> None:
    """Section 17: a reverse view's derivations and the backing file of `sub/hello.txt`."""
    k_rev = hkdf(mk, vid, b"cloakfs v1 reverse", 32)
    assert k_rev.hex() == "f74451dd4b7cda858e0b00eb4b282952f84b8d8bc9df5c90e371d4bdb40a770c"
    prf = lambda *parts: hmac.new(k_rev, b"".join(parts), hashlib.sha256).digest()  # noqa: E731
    d = prf(b"dir\0", b"sub")[:16]
    assert d.hex() == "90a0aeaf7de60b5cdd27e536c0f84619", d.hex()
    f = prf(b"file\0", b"sub/hello.txt")[:16]
    n = prf(b"nonce\0", f, struct.pack(">Q", 0))[:12]
    fk = hkdf(hkdf(mk, vid, b"cloakfs v1 content", 32), None, b"cloakfs v1 file" + f, 32)
    backing = struct.pack(">H", 1) + f + n + AESGCMSIV(fk).encrypt(n, plain, f + struct.pack(">Q", 0))
    assert backing.hex() == (
        "000191e4ff240190351119aca487e7b27b3b9b6877fcec8a679c446090870b3191194d772684b2e33e"
        "77ea00ac19fb76d0e8ee0c6c4baccf31824f5171ea02e8e7ce7be9"), backing.hex()
    name = b64(AESSIV(hkdf(mk, vid, b"cloakfs v1 names", 64)).encrypt(b"hello.txt", [d]))
    assert name == "hv631nmLUYoHbYQt8R29MR0HULnJGipapg", name


# Section 15.7: the share files and the config with one slot of each kind.
VECTOR_SHARE_FILES = [
    "# cloakfs key share 1 of 3: any 2 of them open key slot 3 of volume oKGio6SlpqeoqaqrrK2urw\n"
    "cloakfs-share:AaChoqOkpaanqKmqq6ytrq8AAAADAgMB4OHi4-Tl5ufo6err7O3u7_Dx8vP09fb3-Pn6-_z9_v-JyRKU\n",
    "# cloakfs key share 2 of 3: any 2 of them open key slot 3 of volume oKGio6SlpqeoqaqrrK2urw\n"
    "cloakfs-share:AaChoqOkpaanqKmqq6ytrq8AAAADAgMC7ezv7uno6-rl5Ofm4eDj4p2cn56ZmJualZSXlpGQk5LakGWk\n",
    "# cloakfs key share 3 of 3: any 2 of them open key slot 3 of volume oKGio6SlpqeoqaqrrK2urw\n"
    "cloakfs-share:AaChoqOkpaanqKmqq6ytrq8AAAADAgMDHRwfHhkYGxoVFBcWERATEk1MT05JSEtKRURHRkFAQ0IMZLBR\n",
]
VECTOR_IDENTITY = "AGE-SECRET-KEY-1XQCNYVE5X5MRWWPE8GANC0F78AQYZSJRG3Z5V36GF99YKNZDFE8SPETATX"
VECTOR_RECIPIENT = "age1xnjz6jh4a722q736sssphzyafng6ws7ty7c3k6ssgw9gl6uwtprss08l77"
VECTOR_RECOVERY = "G20R-50W4-GP38-F249-HA5R-S3CE-HY89-34MK-JJAS-D5WR-K6D9-Q74X-KTFX-4SZ1"
VECTOR_SLOTS_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                   "crates", "cloakfs-core", "tests", "vectors", "slot-kinds.conf")


def self_test_slots(seq, mk):
    assert gf_mul(0x80, 0x02) == 0x1D and gf_inv(0x03) == 0xF4
    assert encode_recovery_key(seq(0x80, 32)) == VECTOR_RECOVERY
    assert parse_recovery_key(VECTOR_RECOVERY.lower().replace("-", " ")) == seq(0x80, 32)
    shares = [parse_share_file(t.encode(), f"share {i + 1}", [])
              for i, t in enumerate(VECTOR_SHARE_FILES)]
    assert shares[0].y == seq(0xE0, 32)
    assert shares[1].y.hex() == "edecefeee9e8ebeae5e4e7e6e1e0e3e29d9c9f9e99989b9a9594979691909392"
    for a, b in ((0, 1), (0, 2), (1, 2), (2, 0)):
        assert shamir_combine([shares[a], shares[b]]) == seq(0x10, 32)
    config = load_config(VECTOR_SLOTS_CONFIG)

    def opens(want_id, **given):
        secrets = Secrets()
        for k, v in given.items():
            setattr(secrets, k, v)
        check_shares(config, secrets)
        got, slot = config.unlock(secrets)
        assert (got, slot["id"]) == (mk, str(want_id)), (slot["id"], want_id)

    opens(1, passphrase=b"correct horse battery staple")
    opens(2, keyfile=seq(0x40, 64))
    opens(3, shares=[("share 2", shares[1]), ("share 3", shares[2])])
    opens(4, recovery=parse_recovery_key(VECTOR_RECOVERY))
    ids = load_identities(VECTOR_IDENTITY.encode(), "vector identity")
    assert str(ids[0].to_public()) == VECTOR_RECIPIENT
    opens(5, identities=ids)
    try:
        opens(3, shares=[("share 1", shares[0]), ("share 1 again", shares[0])])
        raise AssertionError("one share opened a 2-of-3 slot")
    except VolumeError as e:
        assert "1 distinct share(s) of slot 3 given, 2 needed" in str(e), e


def read_secrets(args) -> Secrets:
    secrets = Secrets()
    if args.passfile is not None:
        with open(args.passfile, "rb") as f:
            line = f.read().split(b"\n", 1)[0]
        secrets.passphrase = line[:-1] if line.endswith(b"\r") else line
    if args.keyfile is not None:
        with open(args.keyfile, "rb") as f:
            data = f.read((8 << 20) + 1)
        if not data or len(data) > 8 << 20:
            raise VolumeError(f"key file {args.keyfile} is empty or larger than 8 MiB")
        secrets.keyfile = data
    if args.recovery_key_file is not None:
        with open(args.recovery_key_file, "rb") as f:
            data = f.read(4097)
        if len(data) > 4096:
            raise VolumeError(f"recovery key file {args.recovery_key_file} is too large")
        try:
            secrets.recovery = parse_recovery_key(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise VolumeError(f"recovery key file {args.recovery_key_file} is not text")
    for path in args.identity:
        with open(path, "rb") as f:
            secrets.identities += load_identities(f.read(1 << 20), path)
    for path in args.share:
        with open(path, "rb") as f:
            data = f.read(64 * 1024 + 1)
        secrets.shares.append((path, parse_share_file(data, path, secrets.identities)))
    return secrets


def main(argv):
    if argv[1:] == ["--self-test"]:
        self_test()
        return 0
    usage = __doc__.strip().split("\n\n")[2]
    parser = argparse.ArgumentParser(prog="decrypt_volume.py", usage="\n" + usage,
                                     add_help=False)
    parser.add_argument("--config")
    parser.add_argument("--passfile")
    parser.add_argument("--keyfile")
    parser.add_argument("--recovery-key-file")
    parser.add_argument("--share", action="append", default=[])
    parser.add_argument("--identity", action="append", default=[])
    parser.add_argument("paths", nargs="*")
    args = parser.parse_args(argv[1:])  # exits with status 2 on a usage error
    if len(args.paths) == 3 and args.passfile is None:
        cipherdir, args.passfile, outdir = args.paths
    elif len(args.paths) == 2:
        cipherdir, outdir = args.paths
    else:
        parser.error("give CIPHERDIR and OUTDIR (and the secrets)")
    if not (args.passfile or args.keyfile or args.recovery_key_file or args.share
            or args.identity):
        parser.error("give at least one secret")
    config_path = args.config or os.path.join(cipherdir, CONFIG_FILE)
    try:
        secrets = read_secrets(args)
        if os.path.exists(outdir) and os.listdir(outdir):
            raise VolumeError(f"output directory {outdir} is not empty")
        os.makedirs(outdir, exist_ok=True)
        counts, slot = decrypt_volume(cipherdir, config_path, secrets, outdir)
    except (VolumeError, OSError) as e:
        print(f"decrypt_volume: {e}", file=sys.stderr)
        return 1
    print(f"decrypt_volume: unlocked with slot {slot['id']} ({slot['kind']})")
    print("decrypt_volume: ok: {files} files, {dirs} directories, {symlinks} symlinks, "
          "{special} special files".format(**counts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
