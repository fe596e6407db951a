#!/usr/bin/env python3
"""Independent decryptor for cloakfs volumes (format version 1).

Written from docs/FORMAT.md alone (no code shared with the Rust implementation), to show that the
document is complete and to catch drift between it and the code.

    decrypt_volume.py [--config FILE] CIPHERDIR PASSFILE OUTDIR
    decrypt_volume.py --self-test

The passphrase is the first line of PASSFILE, without its line feed (and a carriage return
before it), as with `cloakfs --passfile`. OUTDIR must not exist or be empty; the whole plaintext
tree is written there (regular files, directories, symlinks; fifos are recreated, sockets and
device nodes are reported and skipped).

The config MAC is verified before anything else is decrypted, and every block, name and symlink
target must authenticate. Exit status: 0 on success, 1 on any error (wrong passphrase, damaged
or tampered volume, unsupported version: one line on stderr), 2 on a usage error. On error OUTDIR
may hold a partial tree.

Needs the `cryptography` and `argon2-cffi` packages.
"""

import base64
import hashlib
import hmac
import json
import os
import stat
import struct
import sys

from argon2.low_level import Type, hash_secret_raw
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESSIV, ChaCha20Poly1305
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
    "block_size", "long_name_max", "holes",
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
        if self.content_cipher not in ("aes-256-gcm", "xchacha20-poly1305"):
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

    def unlock(self, passphrase: bytes) -> bytes:
        """Section 5: returns the master key after verifying the MAC."""
        for i, slot in enumerate(self.slots):
            if slot["kind"] != "passphrase":
                continue
            what = f"slots[{i}]"
            m = number(slot, "argon2_memory_kib", what, 64, 4 * 1024 * 1024)
            t = number(slot, "argon2_iterations", what, 1, 1000)
            p = number(slot, "argon2_lanes", what, 1, 64)
            if m < 8 * p:
                raise VolumeError(f"damaged config: {what}: memory below 8 KiB per lane")
            if field(slot, "kdf", what) != "argon2id":
                raise VolumeError(f"unsupported kdf {slot['kdf']!r} in {what}")
            salt = unb64(field(slot, "salt", what), f"{what}.salt", 32)
            wrapped = unb64(field(slot, "wrapped", what), f"{what}.wrapped", 60)
            kek = hash_secret_raw(passphrase, salt, time_cost=t, memory_cost=m,
                                  parallelism=p, hash_len=32, type=Type.ID, version=19)
            try:
                mk = AESGCM(kek).decrypt(wrapped[:12], wrapped[12:], self.wrap_aad(slot))
            except InvalidTag:
                continue
            key = hkdf(mk, self.volume_id, b"cloakfs v1 config-mac", 32)
            mac = hmac.new(key, self.canonical(), hashlib.sha256).digest()
            if not hmac.compare_digest(mac, self.mac):
                raise VolumeError("config was modified without the key (MAC mismatch)")
            return mk
        raise VolumeError("wrong passphrase: no key slot accepts it")


# --------------------------------------------------------------------------------------------
# Sections 7-11: keys, contents, names, symlinks

HEADER_LEN = 18


class Volume:
    def __init__(self, config: Config, mk: bytes):
        c = config
        self.c = c
        sub = lambda label, n: hkdf(mk, c.volume_id, b"cloakfs v1 " + label, n)  # noqa: E731
        self.k_content = sub(b"content", 32)
        self.k_names = sub(b"names", 64)
        self.k_xattr_names = sub(b"xattr-names", 64)
        self.k_metadata = sub(b"metadata", 32)
        if c.content_cipher == "aes-256-gcm":
            self.nonce_len, self.aead = 12, AESGCM
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

    def decrypt_file(self, data: bytes) -> bytes:
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
    def decrypt_symlink(self, target: bytes) -> bytes:
        sealed = unb64(target, "symlink target")
        if len(sealed) < 28:
            raise VolumeError("symlink target too short")
        try:
            return AESGCM(self.k_metadata).decrypt(sealed[:12], sealed[12:], b"symlink")
        except InvalidTag:
            raise VolumeError("symlink target does not authenticate")

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


def decrypt_dir(vol: Volume, backing: bytes, dir_id: bytes, out: bytes, counts: dict):
    seen = {}
    for entry in sorted(os.listdir(backing)):
        path = os.path.join(backing, entry)
        where = path.decode("utf-8", "replace")
        try:
            kind = classify(entry)
            if kind == "internal":
                continue
            if kind == "long":
                text = read_regular(path + b".name", "long-name sidecar").rstrip()
                if b"cloakfs.long." + b64(hashlib.sha256(text).digest()).encode() != entry:
                    raise VolumeError("long-name sidecar does not match its entry")
                if len(text) <= vol.c.long_name_max:
                    raise VolumeError("long-name entry for a short encrypted name")
                enc = text
            else:
                if len(entry) > vol.c.long_name_max:
                    raise VolumeError("encrypted name longer than long_name_max")
                enc = entry
            name = vol.decrypt_name(dir_id, enc)
            if name in seen:
                raise VolumeError(f"two entries decrypt to the same name ({seen[name]!r})")
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
                os.symlink(vol.decrypt_symlink(os.readlink(path)), target)
                counts["symlinks"] += 1
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    plain = vol.decrypt_file(f.read())
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


def decrypt_volume(cipherdir: str, config_path: str, passphrase: bytes, outdir: str) -> dict:
    with open(config_path, "rb") as f:
        raw = f.read(CONFIG_MAX + 1)
    if len(raw) > CONFIG_MAX:
        raise VolumeError("config file too large")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise VolumeError("damaged config: not UTF-8")
    config = Config(text)
    vol = Volume(config, config.unlock(passphrase))
    counts = {"dirs": 0, "files": 0, "symlinks": 0, "special": 0}
    decrypt_dir(vol, os.fsencode(cipherdir), config.volume_id, os.fsencode(outdir), counts)
    return counts


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
    k_xn = hkdf(mk, vid, b"cloakfs v1 xattr-names", 64)
    k_meta = hkdf(mk, vid, b"cloakfs v1 metadata", 32)
    stored = "user." + b64(AESSIV(k_xn).encrypt(b"comment", [b"xattr"]))
    assert stored == "user.ktqbu3OlLXEsrBpiOowSBHmufY0UbTE", stored
    n = seq(0xB0, 12)
    val = n + AESGCM(k_meta).encrypt(n, b"a plaintext comment", b"xattr:" + stored.encode())
    assert val.hex() == (
        "b0b1b2b3b4b5b6b7b8b9babba1702c8a45ef391ff135881d5daf5c66934d06867ff71665beb0bd0f"
        "ca43837b0428f7"), val.hex()
    print("decrypt_volume: self-test passed")


def main(argv):
    args = argv[1:]
    if args == ["--self-test"]:
        self_test()
        return 0
    config_path = None
    if len(args) >= 2 and args[0] == "--config":
        config_path, args = args[1], args[2:]
    if len(args) != 3:
        print("usage:\n" + __doc__.strip().split("\n\n")[2], file=sys.stderr)
        return 2
    cipherdir, passfile, outdir = args
    if config_path is None:
        config_path = os.path.join(cipherdir, CONFIG_FILE)
    try:
        with open(passfile, "rb") as f:
            passphrase = f.read()
        passphrase = passphrase.split(b"\n", 1)[0]
        if passphrase.endswith(b"\r"):
            passphrase = passphrase[:-1]
        if os.path.exists(outdir) and os.listdir(outdir):
            raise VolumeError(f"output directory {outdir} is not empty")
        os.makedirs(outdir, exist_ok=True)
        counts = decrypt_volume(cipherdir, config_path, passphrase, outdir)
    except (VolumeError, OSError) as e:
        print(f"decrypt_volume: {e}", file=sys.stderr)
        return 1
    print("decrypt_volume: ok: {files} files, {dirs} directories, {symlinks} symlinks, "
          "{special} special files".format(**counts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
