#!/usr/bin/env python3
"""Decrypts one backing file of a cloakfs sharing volume with an age identity or a gpg keyring,
written from docs/FORMAT.md section 18 (and section 8 for the blocks) only: no volume config is
needed.

    decrypt_shared_file.py [--master-key HEX --volume-id HEX] BACKINGFILE IDENTITYFILE OUTPUT [GNUPGHOME]

IDENTITYFILE may be "-" (no age identity). With GNUPGHOME, kind-2 entries (`gpg:FINGERPRINT`)
are opened with `gpg --decrypt` in that keyring, accepted only as an integrity-checked
public-key decryption.

With --master-key and --volume-id (a volume with `shared_header_mac`, section 18.2), the header's
volume MAC is required and checked first; without them a volume MAC in the header is skipped.
Checks the recipient-list MAC before opening any block; exits 2 (with one line) if the
identity has no entry, 1 on damage or tampering. Needs `cryptography` and `pyrage`.
"""

import hashlib
import hmac
import os
import struct
import subprocess
import sys

import pyrage
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESSIV
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

H = 4096
B = 4096
NONCE, TAG = 12, 16  # aes-256-gcm (the default content cipher)


class Refused(Exception):
    pass


def hkdf(ikm: bytes, info: bytes, salt=None) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(ikm)


def parse_header(h: bytes):
    if len(h) < H:
        raise Refused("truncated header")
    h = h[:H]
    (version,) = struct.unpack(">H", h[:2])
    if version not in (2, 3):
        raise Refused(f"unsupported file header version {version}")
    fid = h[2:18]
    (n,) = struct.unpack(">H", h[18:20])
    at = 20
    entries = []

    def take():
        nonlocal at
        if at + 2 > H:
            raise Refused("entry past the end")
        (ln,) = struct.unpack(">H", h[at:at + 2])
        if at + 2 + ln > H:
            raise Refused("entry past the end")
        part = h[at + 2:at + 2 + ln]
        at += 2 + ln
        return part

    for _ in range(n):
        kind = None
        if version == 3:
            if at + 1 > H:
                raise Refused("entry past the end")
            kind = h[at]
            at += 1
        r = take().decode("utf-8")
        if not r or "\n" in r:
            raise Refused("recipient is not one line of text")
        sealed = take()
        wfk = None
        if version == 3:
            if at + 48 > H:
                raise Refused("entry past the end")
            wfk = h[at:at + 48]
            at += 48
        entries.append((kind, r, sealed, wfk))
    if at + 32 > H:
        raise Refused("MAC past the end")
    mac = h[at:at + 32]
    at += 32
    vmac = h[at:at + 32]
    if any(vmac):
        at += 32
    else:
        vmac = None
    if any(h[at:]):
        raise Refused("non-zero padding")
    return version, fid, entries, h[:at - 32 - (32 if vmac else 0)], mac, vmac


def gpg_decrypt(sealed: bytes, gnupghome: str):
    """W from a kind-2 entry: `gpg --decrypt`, accepted only if gpg's status lines show a
    public-key decryption, integrity checked, of one literal packet (None: not ours)."""
    env = dict(os.environ, GNUPGHOME=gnupghome)
    p = subprocess.run(["gpg", "--batch", "--quiet", "--no-tty", "--status-fd", "2",
                        "--decrypt", "--output", "-"],
                       input=sealed, capture_output=True, env=env)
    status = [l[len("[GNUPG:] "):].split(" ")[0]
              for l in p.stderr.decode("utf-8", "replace").splitlines()
              if l.startswith("[GNUPG:] ")]
    if p.returncode != 0:
        return None
    if ("NEED_PASSPHRASE_SYM" in status or "SYM_ENCRYPTED" in status
            or "DECRYPTION_KEY" not in status or "DECRYPTION_OKAY" not in status
            or "DECRYPTION_FAILED" in status or status.count("PLAINTEXT") != 1):
        raise Refused("a gpg entry is not an integrity-checked public-key decryption")
    return p.stdout


def main():
    args = sys.argv[1:]
    header_key = None
    if args[:1] == ["--master-key"]:
        if args[2:3] != ["--volume-id"]:
            raise Refused("--master-key needs --volume-id")
        mk, vid = bytes.fromhex(args[1]), bytes.fromhex(args[3])
        header_key = hkdf(mk, b"cloakfs v1 share-header", salt=vid)
        args = args[4:]
    backing, identity_file, output = args[:3]
    gnupghome = args[3] if len(args) > 3 else None
    data = open(backing, "rb").read()
    ids = [] if identity_file == "-" else [
        pyrage.x25519.Identity.from_str(l.strip())
        for l in open(identity_file).read().splitlines()
        if l.strip().startswith("AGE-SECRET-KEY-1")]
    version, fid, entries, body, mac, vmac = parse_header(data)
    if header_key is not None:
        if vmac is None:
            raise Refused("the header has no volume MAC (made without the volume key)")
        want = hmac.new(header_key, b"cloakfs shared header volume mac\n" + body + mac,
                        hashlib.sha256).digest()
        if not hmac.compare_digest(want, vmac):
            raise Refused("the header failed authentication under the volume key")
    fk = None
    for kind, _, sealed, wfk in entries:
        if version == 3 and kind == 2:
            if gnupghome is None:
                continue
            pt = gpg_decrypt(sealed, gnupghome)
            if pt is None:
                continue
        elif version == 3 and kind != 1:
            continue  # a kind this reader does not know
        else:
            if not ids:
                continue
            try:
                pt = pyrage.decrypt(sealed, ids)
            except pyrage.DecryptError:
                continue
        if version == 2:
            if len(pt) != 32:
                raise Refused("an entry does not hold a 32-byte key")
            fk = pt
        else:
            if len(pt) != 64:
                raise Refused("an entry does not hold a 64-byte recipient key")
            try:
                fk = AESSIV(pt).decrypt(wfk, [fid])
            except Exception:
                raise Refused("an entry's file key does not belong to this file")
        break
    if fk is None:
        print("decrypt_shared_file: permission denied: no entry for this identity", file=sys.stderr)
        sys.exit(2)
    k_list = hkdf(fk, b"cloakfs v1 share-list" + fid)
    domain = b"cloakfs shared header v%d\n" % version
    want = hmac.new(k_list, domain + body, hashlib.sha256).digest()
    if not hmac.compare_digest(want, mac):
        raise Refused("recipient list failed authentication")
    aead = AESGCM(hkdf(fk, b"cloakfs v1 file" + fid))
    out = bytearray()
    rest = data[H:]
    n = 0
    while rest:
        blk, rest = rest[:B + NONCE + TAG], rest[B + NONCE + TAG:]
        if len(blk) <= NONCE + TAG:
            raise Refused(f"block {n} truncated")
        if len(blk) == B + NONCE + TAG and not any(blk):
            out += bytes(B)  # a hole (sparse volume)
        else:
            out += aead.decrypt(blk[:NONCE], blk[NONCE:], fid + struct.pack(">Q", n))
        n += 1
    open(output, "wb").write(out)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line, never a traceback
        print(f"decrypt_shared_file: {e}", file=sys.stderr)
        sys.exit(1)
