#!/usr/bin/env bash
# The Debian package, installed for real: scripts/package.sh builds it, then, in a private
# view of this machine (a mount namespace whose /usr, /etc and /var are overlays on a
# tmpfs, with /home and /run its own), `apt-get install ./target/debian/cloakfs_*.deb`
# installs it, each of its parts is checked in use, `apt-get remove` takes it all away but
# root's record of known volumes, and `apt-get purge` that too.
# Nothing of it shows outside the namespace. Run as root; about 30 s after a release build.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "${CLOAKFS_PACKAGE_TEST_INSIDE:-}" != 1 ]; then
    deb=$(scripts/package.sh | tail -1)
    case $deb in
        target/debian/cloakfs_*_"$(dpkg --print-architecture)".deb) ;;
        *) echo "package test: unexpected package name: $deb" >&2; exit 1 ;;
    esac
    scratch=$(mktemp -d /tmp/cloakfs-pkgtest.XXXXXX)
    rc=0
    CLOAKFS_PACKAGE_TEST_INSIDE=1 unshare -m --propagation private "$0" "$deb" "$scratch" || rc=$?
    rmdir "$scratch"
    exit $rc
fi

deb=$1 scratch=$2
fail() { echo "package test: FAILED: $*" >&2; exit 1; }
step() { echo "package test: $*"; }

# --- the private view ---
mount -t tmpfs cloakfs-pkgtest "$scratch"
for dir in usr etc var; do
    mkdir -p "$scratch/$dir.upper" "$scratch/$dir.work"
    mount -t overlay overlay \
        -o "lowerdir=/$dir,upperdir=$scratch/$dir.upper,workdir=$scratch/$dir.work" "/$dir"
done
mount -t tmpfs cloakfs-pkgtest-home /home
mount -t tmpfs cloakfs-pkgtest-run /run
# /dev/fuse open to every user, as udev makes it on Debian (here it may be root's alone).
mknod -m 666 "$scratch/fuse" c 10 229
mount --bind "$scratch/fuse" /dev/fuse

user=cfspkg1
cleanup() {
    local uid
    uid=$(id -u "$user" 2>/dev/null) || return 0
    for pid in $(pgrep -u "$uid" || true); do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

multiarch=$(gcc -print-multiarch)
files=(
    /usr/bin/cloakfs
    /sbin/mount.fuse.cloakfs
    "/usr/lib/$multiarch/security/pam_cloakfs.so"
    /usr/share/pam-configs/cloakfs
    /lib/systemd/system/cloakfs-daemon.service
    /usr/share/man/man1/cloakfs.1.gz
    /usr/share/man/man1/cloakfs-mount.1.gz
    /usr/share/bash-completion/completions/cloakfs
    /usr/share/zsh/vendor-completions/_cloakfs
    /usr/share/fish/vendor_completions.d/cloakfs.fish
)
for f in "${files[@]}"; do
    [ ! -e "$f" ] || fail "$f exists before the install"
done

# --- install ---
step "apt-get install ./$deb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$PWD/$deb" >"$scratch/apt.log" 2>&1 \
    || { cat "$scratch/apt.log" >&2; fail "apt-get install"; }
for f in "${files[@]}"; do
    [ -e "$f" ] || fail "$f not installed"
done
cloakfs --version | grep -q "reads volume format 1" || fail "cloakfs --version"

# --- man pages: one per command ---
step "man pages"
commands=$(cloakfs --help | sed -n '/^Commands:/,/^$/p' | awk 'NR > 1 && $1 != "help" {print $1}')
[ "$(echo "$commands" | wc -w)" -gt 20 ] || fail "too few commands: $commands"
for c in "" $commands; do
    page=cloakfs${c:+-$c}
    man -w "$page" >/dev/null 2>&1 || fail "man $page not found"
done
MANWIDTH=80 man -P cat cloakfs 2>/dev/null | grep -q "EXIT STATUS" || fail "man cloakfs"
MANWIDTH=80 man -P cat cloakfs-mount 2>/dev/null | grep -q "fstab" || fail "man cloakfs-mount"

# --- completions, each loaded by its shell ---
step "completions"
reply=$(bash -c 'source /usr/share/bash-completion/bash_completion
    _completion_loader cloakfs
    COMP_WORDS=(cloakfs setup-); COMP_CWORD=1; COMP_LINE="cloakfs setup-"; COMP_POINT=14
    $(complete -p cloakfs | sed "s/.*-F \([^ ]*\) .*/\1/") cloakfs setup- cloakfs
    echo "${COMPREPLY[@]}"')
[ "$reply" = setup-private ] || fail "bash completes 'cloakfs setup-' to '$reply'"
zsh -c 'fpath=(/usr/share/zsh/vendor-completions $fpath); autoload -Uz compinit; compinit -u;
    [[ $_comps[cloakfs] = _cloakfs ]]' || fail "zsh does not load _cloakfs"
fish -c 'complete -C "cloakfs setup-"' | grep -q '^setup-private' || fail "fish completion"

# --- the systemd unit ---
step "systemd unit"
grep -q '^ExecStart=/usr/bin/cloakfs daemon' /lib/systemd/system/cloakfs-daemon.service \
    || fail "the unit does not run /usr/bin/cloakfs"
systemd-analyze verify /lib/systemd/system/cloakfs-daemon.service \
    || fail "systemd-analyze verify"

# --- mount -t fuse.cloakfs and fstab, through the installed helper ---
step "mount -t fuse.cloakfs and fstab"
vol=$scratch/vault.enc plain=$scratch/vault pass=$scratch/vault.pass
mkdir "$plain"
echo "correct horse battery staple" > "$pass"
cloakfs init --kdf-memory 64 --kdf-iterations 1 --passfile "$pass" "$vol" >/dev/null
mount -t fuse.cloakfs "$vol" "$plain" -o "passfile=$pass"
echo hello > "$plain/hello"
findmnt -n -o FSTYPE "$plain" | grep -q '^fuse.cloakfs$' || fail "not a cloakfs mount"
umount "$plain"
[ ! -e "$plain/hello" ] || fail "still mounted"
echo "$vol $plain fuse.cloakfs passfile=$pass,noauto,nodev 0 0" >> /etc/fstab
mount "$plain"
[ "$(cat "$plain/hello")" = hello ] || fail "fstab mount does not show the file"
umount "$plain"

# --- PAM: the profile turned on, a login through the common stacks ---
step "pam-auth-update --enable cloakfs, then a login with pamtester"
grep -q pam_cloakfs /etc/pam.d/common-auth && fail "the profile is on before it is enabled"
pam-auth-update --enable cloakfs
for stack in auth session password; do
    grep -q 'pam_cloakfs.so' "/etc/pam.d/common-$stack" || fail "common-$stack lacks the module"
done
login_pass="Pkg-login-$RANDOM-horse-battery"
useradd -m -s /bin/bash "$user"
echo "$user:$login_pass" | chpasswd
printf '%s\n' "$login_pass" > "$scratch/login.pass"
chmod 644 "$scratch/login.pass"
su "$user" -c "cloakfs setup-private --kdf-memory 64 --kdf-iterations 1 --passfile $scratch/login.pass" \
    > "$scratch/setup.out" || fail "setup-private"
grep -q '~/.Private.enc' "$scratch/setup.out" || fail "setup-private prints no config line"
echo "* ~/.Private.enc ~/Private" > /etc/security/cloakfs.conf
printf '@include common-auth\n@include common-account\n@include common-session\n@include common-password\n' \
    > /etc/pam.d/cloakfs-pkgtest
echo "$login_pass" | pamtester cloakfs-pkgtest "$user" authenticate open_session \
    >"$scratch/pam.log" 2>&1 || { cat "$scratch/pam.log" >&2; fail "pamtester login"; }
findmnt -n "/home/$user/Private" >/dev/null || fail "~/Private not mounted after the login"
su "$user" -c 'echo diary > ~/Private/diary'
echo "$login_pass" | pamtester cloakfs-pkgtest "$user" authenticate open_session close_session \
    >"$scratch/pam.log" 2>&1 || { cat "$scratch/pam.log" >&2; fail "pamtester logout"; }
! findmnt -n "/home/$user/Private" >/dev/null || fail "~/Private still mounted after the last logout"
su "$user" -c "cloakfs cat --passfile $scratch/login.pass ~/.Private.enc diary" | grep -q diary \
    || fail "the diary is not in the volume"

# --- remove ---
step "apt-get remove cloakfs"
DEBIAN_FRONTEND=noninteractive apt-get remove -y -q cloakfs >"$scratch/apt.log" 2>&1 \
    || { cat "$scratch/apt.log" >&2; fail "apt-get remove"; }
for f in "${files[@]}" /sbin/mount.cloakfs /usr/share/doc/cloakfs; do
    [ ! -e "$f" ] && [ ! -L "$f" ] || fail "$f left after remove"
done
! grep -rq pam_cloakfs /etc/pam.d/common-* || fail "pam_cloakfs left in /etc/pam.d/common-*"
[ -z "$(dpkg-query -W -f='${Status}' cloakfs 2>/dev/null | grep ' installed')" ] \
    || fail "dpkg still lists cloakfs as installed"
# remove keeps root's record of known volumes (its key pins), written by the mounts above;
# purge takes it, and says so.
[ -s /var/lib/cloakfs/known_volumes.json ] || fail "remove took root's known volumes"
step "apt-get purge cloakfs"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -q cloakfs >"$scratch/apt.log" 2>&1 \
    || { cat "$scratch/apt.log" >&2; fail "apt-get purge"; }
[ ! -e /var/lib/cloakfs ] || fail "/var/lib/cloakfs left after purge"
grep -q "removed /var/lib/cloakfs" "$scratch/apt.log" || fail "purge did not say what it removed"
step "ok"
