#!/usr/bin/env bash
# Builds the Debian package: target/debian/cloakfs_<version>_<arch>.deb (dpkg-deb).
#
# It holds /usr/bin/cloakfs, the mount(8) helpers /sbin/mount.fuse.cloakfs and
# /sbin/mount.cloakfs (links to it), pam_cloakfs.so in the multiarch security directory with
# the pam-auth-update profile /usr/share/pam-configs/cloakfs (off until enabled), the
# multi-user daemon's systemd unit (not enabled), and the man pages and bash, zsh and fish
# completions that `cloakfs` generates from its command-line definition.
set -euo pipefail
cd "$(dirname "$0")/.."

# The whole workspace, as scripts/test.sh builds it (one feature set: no rebuild).
cargo build --release --workspace
bin=target/release/cloakfs
version=$("$bin" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
multiarch=$(gcc -print-multiarch)
stage=target/debian/cloakfs_${version}_${arch}
deb=$stage.deb

rm -rf "$stage" "$deb"
mkdir -p "$stage/DEBIAN"
put() { # put MODE SOURCE DEST: one file of the package
    install -D -m "$1" "$2" "$stage$3"
}
put 755 "$bin" /usr/bin/cloakfs
put 644 target/release/libpam_cloakfs.so "/usr/lib/$multiarch/security/pam_cloakfs.so"
strip --strip-unneeded "$stage/usr/bin/cloakfs" "$stage/usr/lib/$multiarch/security/pam_cloakfs.so"
mkdir -p "$stage/sbin"
ln -s /usr/bin/cloakfs "$stage/sbin/mount.fuse.cloakfs"
ln -s /usr/bin/cloakfs "$stage/sbin/mount.cloakfs"
put 644 dist/debian/pam-config /usr/share/pam-configs/cloakfs
mkdir -p "$stage/lib/systemd/system"
sed 's|/usr/local/bin/cloakfs|/usr/bin/cloakfs|' dist/cloakfs-daemon.service \
    > "$stage/lib/systemd/system/cloakfs-daemon.service"

man=$stage/usr/share/man/man1
"$bin" man-pages "$man"
gzip -9n "$man"/*.1
comp=$stage/usr/share
mkdir -p "$comp/bash-completion/completions" "$comp/zsh/vendor-completions" \
    "$comp/fish/vendor_completions.d"
"$bin" completions bash > "$comp/bash-completion/completions/cloakfs"
"$bin" completions zsh > "$comp/zsh/vendor-completions/_cloakfs"
"$bin" completions fish > "$comp/fish/vendor_completions.d/cloakfs.fish"

doc=$stage/usr/share/doc/cloakfs
mkdir -p "$doc/examples"
cat > "$doc/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: cloakfs

Files: *
License: $(sed -n 's/^license = "\(.*\)"/\1/p' Cargo.toml)
EOF
cat > "$doc/examples/cloakfs.conf" <<'EOF'
# /etc/security/cloakfs.conf: the volumes pam_cloakfs.so mounts at login.
# WHO (user, @group or *)  CIPHERDIR  MOUNTPOINT  [cloakfs mount -o OPTIONS]
# ~ is the user's home directory, %u the user name. `cloakfs setup-private` makes the volume.
*   ~/.Private.enc   ~/Private
EOF
find "$stage" -type d -exec chmod 755 {} +

for script in postinst prerm postrm; do
    install -m 755 "dist/debian/$script" "$stage/DEBIAN/$script"
done
cat > "$stage/DEBIAN/control" <<EOF
Package: cloakfs
Version: $version
Architecture: $arch
Maintainer: cloakfs maintainers <cloakfs@localhost>
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Depends: libc6 (>= 2.34), libgcc-s1, libpam0g (>= 1.4), fuse3, libpam-runtime (>= 1.0.1-6)
Recommends: bash-completion
Section: utils
Priority: optional
Description: transparent encrypting file system (FUSE)
 cloakfs mounts a plaintext view of an encrypted directory: only ciphertext,
 encrypted names and encrypted metadata reach the directory, so backups and
 sync clients work on it without the key. This package has the cloakfs
 command, its mount(8) helper, the PAM module pam_cloakfs.so that unlocks a
 volume at login (enable with pam-auth-update --enable cloakfs), and the
 multi-user daemon's systemd unit.
EOF
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
rm -rf "$stage"
echo "$deb"
