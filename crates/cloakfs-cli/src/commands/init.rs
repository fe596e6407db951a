//! `cloakfs init`: create a volume.

use crate::args::NewPassArgs;
use crate::failure::{Failure, Result};
use crate::secret_input::read_new_passphrase;
use clap::Args;
use cloakfs_core::crypto::kdf::{Argon2Params, DEFAULT_MEMORY_KIB};
use cloakfs_core::crypto::secret::Passphrase;
use cloakfs_core::format::config::VolumeParams;
use cloakfs_core::format::content::ContentSuite;
use cloakfs_core::format::names::{LONG_NAME_MAX_DEFAULT, LONG_NAME_MAX_MIN};
use cloakfs_core::known_volumes::{KnownVolumes, Place};
use cloakfs_core::Volume;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Where the new passphrase comes from (default: prompt twice).
    #[command(flatten)]
    pub secret: NewPassArgs,
    /// No stored master key: derive it from the passphrase alone (Cryptfs/CFS style). The
    /// passphrase can then never be changed and no other key slot can be added.
    #[arg(long)]
    pub no_stored_key: bool,
    /// Content cipher [default: aes-256-gcm; with --reverse: aes-256-gcm-siv, the only one
    /// it takes].
    /// aes-256-xts keeps every file at its plaintext size and offsets, with no integrity.
    #[arg(long, value_parser = ["aes-256-gcm", "xchacha20-poly1305", "aes-256-gcm-siv", "aes-256-xts"])]
    pub cipher: Option<String>,
    /// Make the config of a reverse view of the plaintext directory DIR (read-only,
    /// deterministic, for backups; see `cloakfs reverse`): written to
    /// DIR/.cloakfs.reverse.conf, hidden from the view, or to --config FILE.
    #[arg(long, conflicts_with_all = ["strict_holes"])]
    pub reverse: bool,
    /// With --reverse: where to write the config instead of DIR/.cloakfs.reverse.conf.
    #[arg(long, value_name = "FILE", requires = "reverse")]
    pub config: Option<PathBuf>,
    /// A sharing volume: every file gets its own random key, granted to members' public keys
    /// one file at a time (`cloakfs share`); members are key slots (`slots add --recipient`).
    #[arg(long, conflicts_with_all = ["no_stored_key", "reverse", "adopt"])]
    pub sharing: bool,
    /// Adopt the existing plaintext tree in the directory: its files stay plaintext, served as
    /// they are (kernel FUSE passthrough where it can), everything created through the mount
    /// is encrypted, and `cloakfs encrypt` converts entries in place.
    #[arg(long, conflicts_with_all = ["reverse"])]
    pub adopt: bool,
    /// Treat all-zero blocks as tampering instead of holes (sparse files then take space).
    #[arg(long)]
    pub strict_holes: bool,
    /// Longest encrypted name stored as is (62..255); shorten for cloud storage limits.
    #[arg(long, default_value_t = 255, value_name = "N")]
    pub long_name_max: usize,
    /// Target time for one Argon2id derivation, in milliseconds (calibrated here).
    #[arg(long, default_value_t = 500, value_name = "MS")]
    pub kdf_time: u64,
    /// Argon2id memory in KiB (skips calibration; default 65536 when iterations are given).
    #[arg(long, value_name = "KIB")]
    pub kdf_memory: Option<u32>,
    /// Argon2id iterations (skips calibration).
    #[arg(long, value_name = "N")]
    pub kdf_iterations: Option<u32>,
    /// The directory that will hold the ciphertext (with --reverse: the plaintext directory).
    pub cipherdir: PathBuf,
}

pub fn run(args: InitArgs) -> Result<()> {
    check_options(&args)?;
    if args.reverse {
        return run_reverse(&args, volume_params(&args));
    }
    // Refuse before asking for a passphrase.
    if args.adopt {
        cloakfs_core::volume::check_adoptable(&args.cipherdir)
            .map_err(|e| Failure::usage(format!("cannot adopt: {e}")))?;
    } else {
        precheck(&args.cipherdir)?;
    }
    check_file_system(&args)?;
    let pass = read_new_passphrase(&args.secret, "New passphrase: ")?;
    create(&args, &pass)
}

/// Whether the cipher directory's file system (or that of its nearest existing ancestor)
/// holds what the content cipher needs: user xattrs for aes-256-xts.
fn check_file_system(args: &InitArgs) -> Result<()> {
    if let Some(dir) = args.cipherdir.ancestors().find(|d| d.is_dir()) {
        cloakfs_core::io::header::check_dir(volume_params(args).content, dir)?;
    }
    Ok(())
}

fn check_options(args: &InitArgs) -> Result<()> {
    let content = volume_params(args).content;
    if !content.authenticated() && args.strict_holes {
        return Err(Failure::usage(
            "--strict-holes needs an authenticated cipher: aes-256-xts cannot tell an \
             all-zero sector from tampering",
        ));
    }
    if !content.authenticated() && args.sharing {
        return Err(Failure::usage(
            "--sharing needs an authenticated cipher: aes-256-xts cannot check a file's \
             recipient list or its contents",
        ));
    }
    if !(LONG_NAME_MAX_MIN..=LONG_NAME_MAX_DEFAULT).contains(&args.long_name_max) {
        return Err(Failure::usage(format!(
            "--long-name-max must be {LONG_NAME_MAX_MIN}..{LONG_NAME_MAX_DEFAULT}"
        )));
    }
    Ok(())
}

fn volume_params(args: &InitArgs) -> VolumeParams {
    let mut params = VolumeParams::new();
    let default_cipher = if args.reverse {
        ContentSuite::Aes256GcmSiv
    } else {
        ContentSuite::Aes256Gcm
    };
    params.content = args.cipher.as_deref().map_or(default_cipher, |c| {
        ContentSuite::from_name(c).expect("clap checked the name")
    });
    params.strict_holes = args.strict_holes;
    if args.sharing {
        params.make_sharing();
    }
    params.long_name_max = args.long_name_max;
    params.adopted = args.adopt;
    // Tests make trees as cloakfs made them before manifests (FORMAT.md section 21.1).
    params.listed =
        args.adopt && std::env::var_os("CLOAKFS_TEST_ADOPT_UNLISTED").is_none_or(|v| v != "1");
    params
}

/// Creates the volume `args` describe with passphrase `pass` (the directory was checked
/// with [`precheck`]), remembers it on this machine, and says so.
pub fn create(args: &InitArgs, pass: &Passphrase) -> Result<()> {
    check_options(args)?;
    let params = volume_params(args);
    let kdf = kdf_params(args)?;
    let volume = if args.no_stored_key {
        Volume::create_no_stored_key(&args.cipherdir, params.clone(), pass, kdf)?
    } else {
        Volume::create(&args.cipherdir, params.clone(), pass, kdf)?
    };
    let fp = volume.master_key().fingerprint(&params.volume_id);
    println!(
        "Created cloakfs volume in {} ({}, {} KiB blocks, Argon2id m={} MiB t={}).",
        args.cipherdir.display(),
        params.content.name(),
        params.block_size / 1024,
        kdf.memory_kib / 1024,
        kdf.iterations
    );
    if let Some(w) = params.content.integrity_warning() {
        println!("Warning: {w}.");
    }
    if args.no_stored_key {
        println!(
            "No stored key: the master key is derived from this passphrase alone. It cannot be \
             changed (cloakfs passwd) and no other key slot can be added; a weak passphrase is \
             the whole key."
        );
    }
    if args.adopt {
        println!(
            "Adopted the plaintext tree: its files stay plaintext until `cloakfs encrypt`; new \
             files are encrypted. Only the plaintext entries there now are ever shown; one \
             that appears later is not. Old plaintext may remain on the disk's free blocks."
        );
    }
    remember(&args.cipherdir, &params, &fp);
    println!(
        "Mount it with: cloakfs mount {} MOUNTPOINT",
        args.cipherdir.display()
    );
    Ok(())
}

/// `init --reverse`: a config for the reverse view of the plaintext directory.
fn run_reverse(args: &InitArgs, params: VolumeParams) -> Result<()> {
    if params.content != ContentSuite::Aes256GcmSiv {
        return Err(Failure::usage(
            "a reverse view is sealed with derived nonces, which only aes-256-gcm-siv allows: \
             leave out --cipher",
        ));
    }
    let plaindir = &args.cipherdir;
    if !plaindir.is_dir() {
        return Err(Failure::usage(format!(
            "{} is not a directory (a reverse view shows an existing plaintext directory)",
            plaindir.display()
        )));
    }
    let config_file = args
        .config
        .clone()
        .unwrap_or_else(|| crate::commands::reverse::default_config(plaindir));
    if config_file.symlink_metadata().is_ok() {
        return Err(Failure::new(
            crate::failure::code::VOLUME,
            format!("{} already exists", config_file.display()),
        ));
    }
    let pass = read_new_passphrase(&args.secret, "New passphrase: ")?;
    let kdf = kdf_params(args)?;
    let volume =
        Volume::create_config_file(&config_file, params.clone(), &pass, kdf, args.no_stored_key)?;
    let fp = volume.master_key().fingerprint(&params.volume_id);
    println!(
        "Created reverse config {} (aes-256-gcm-siv, deterministic, read-only view of {}).",
        config_file.display(),
        plaindir.display()
    );
    remember(&config_file, &params, &fp);
    let config_opt = match &args.config {
        Some(c) => format!(" --config {}", c.display()),
        None => String::new(),
    };
    println!(
        "Mount the encrypted view with: cloakfs reverse{config_opt} {} VIEW",
        plaindir.display()
    );
    Ok(())
}

fn kdf_params(args: &InitArgs) -> Result<Argon2Params> {
    let kdf = match (args.kdf_memory, args.kdf_iterations) {
        (None, None) => Argon2Params::calibrate(Duration::from_millis(args.kdf_time)),
        (m, t) => Argon2Params {
            memory_kib: m.unwrap_or(DEFAULT_MEMORY_KIB),
            iterations: t.unwrap_or(3),
            lanes: 1,
        },
    };
    kdf.validate()
        .map_err(|e| Failure::usage(format!("KDF parameters: {e}")))?;
    Ok(kdf)
}

/// Made here, so trusted here: whatever this machine remembered for the path goes.
fn remember(
    path: &std::path::Path,
    params: &VolumeParams,
    fp: &cloakfs_core::crypto::keys::KeyFingerprint,
) {
    match KnownVolumes::for_this_user()
        .and_then(|k| k.accept(&Place::of(path), &params.volume_id, fp).map(|_| k))
    {
        Ok(k) => println!(
            "Master-key fingerprint: {fp} (remembered on this machine in {}).",
            k.path().display()
        ),
        Err(e) => eprintln!(
            "cloakfs: warning: the volume cannot be remembered on this machine ({e}); its \
             master-key fingerprint is {fp}"
        ),
    }
}

/// Refuses a directory that holds a volume already, or anything else.
pub fn precheck(dir: &std::path::Path) -> Result<()> {
    if dir.join(cloakfs_core::format::config::CONFIG_FILE).exists() {
        return Err(Failure::new(
            crate::failure::code::VOLUME,
            format!("{} already holds a cloakfs volume", dir.display()),
        ));
    }
    match std::fs::read_dir(dir).map(|mut it| it.next().is_some()) {
        Ok(true) => Err(Failure::usage(format!(
            "{} is not empty: a volume must start in an empty directory",
            dir.display()
        ))),
        Ok(false) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Err(Failure::usage(format!(
            "{} is not a directory",
            dir.display()
        ))),
        Err(e) => Err(Failure::other(format!("{}: {e}", dir.display()))),
    }
}
