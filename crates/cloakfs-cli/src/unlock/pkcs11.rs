//! `pkcs11` slots (the smart card of CFS): the KEK is computed by a key that never leaves a
//! PKCS#11 token.
//!
//! On `slots add --pkcs11-module SO --pkcs11-token LABEL`, a 256-bit generic secret key is
//! generated on the token (`CKM_GENERIC_SECRET_KEY_GEN`; token object, private, sensitive, not
//! extractable, sign only) with the label `cloakfs <volume ID> slot <slot ID>` (an existing key
//! with that label is reused). The KEK is the token's `CKM_SHA256_HMAC` (`C_Sign`) over
//! `"cloakfs v1 slot pkcs11" || salt`, where `salt` is 32 random bytes stored in the slot.
//!
//! Fields: `pkcs11_token` (the token's label), `pkcs11_object` (the key object's label),
//! `salt` (b64 of 32 bytes).

use crate::failure::{code, Failure, Result};
use crate::secret_input::{prompt_secret, read_first_line};
use cloakfs_core::slots::{Kek, KeySlot};
use cloakfs_core::text::{b64, Fields};
use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as PError, RvError};
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::types::AuthPin;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Domain prefix of the HMAC input.
pub const HMAC_DOMAIN: &str = "cloakfs v1 slot pkcs11";

/// The label of the key object of slot `slot_id` of volume `volume_id`.
pub fn object_label(volume_id: &[u8; 16], slot_id: u32) -> String {
    format!("cloakfs {} slot {slot_id}", b64(volume_id))
}

fn message(salt: &[u8; 32]) -> Vec<u8> {
    let mut m = HMAC_DOMAIN.as_bytes().to_vec();
    m.extend_from_slice(salt);
    m
}

/// A logged-in session on one token.
pub struct Token {
    label: String,
    session: Session,
    // Keeps the library loaded and initialized as long as the session lives.
    _ctx: Pkcs11,
}

fn p11_error(what: &str, e: PError) -> Failure {
    Failure::other(format!("PKCS#11 {what}: {e}"))
}

impl Token {
    /// Loads `module`, finds the token labelled `label` and logs in with `pin`.
    pub fn open(module: &Path, label: &str, pin: &AuthPin) -> Result<Self> {
        let (ctx, slot) = find_token(module, label)?;
        let session = ctx
            .open_rw_session(slot)
            .map_err(|e| p11_error(&format!("cannot open a session on token {label:?}"), e))?;
        match session.login(UserType::User, Some(pin)) {
            Ok(()) => {}
            Err(PError::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => {}
            Err(PError::Pkcs11(RvError::PinIncorrect, _)) => {
                return Err(Failure::new(
                    code::WRONG_SECRET,
                    format!("wrong PIN for PKCS#11 token {label:?}"),
                ))
            }
            Err(PError::Pkcs11(RvError::PinLocked, _)) => {
                return Err(Failure::new(
                    code::WRONG_SECRET,
                    format!("the PIN of PKCS#11 token {label:?} is locked (too many wrong PINs)"),
                ))
            }
            Err(PError::Pkcs11(RvError::UserPinNotInitialized, _)) => {
                return Err(Failure::other(format!(
                    "PKCS#11 token {label:?} has no user PIN yet: initialize it first"
                )))
            }
            Err(PError::Pkcs11(RvError::PinLenRange, _)) => {
                return Err(Failure::new(
                    code::WRONG_SECRET,
                    format!("wrong PIN for PKCS#11 token {label:?} (bad length)"),
                ))
            }
            Err(e) => return Err(p11_error(&format!("login to token {label:?}"), e)),
        }
        Ok(Self {
            label: label.to_string(),
            session,
            _ctx: ctx,
        })
    }

    /// The secret key object with this label, if the token has one.
    pub fn find_key(&self, object: &str) -> Result<Option<ObjectHandle>> {
        let found = self
            .session
            .find_objects(&[
                Attribute::Class(ObjectClass::SECRET_KEY),
                Attribute::Label(object.as_bytes().to_vec()),
            ])
            .map_err(|e| p11_error("object search", e))?;
        Ok(found.into_iter().next())
    }

    /// The key object with this label, generated (non-extractable) if it does not exist yet.
    pub fn find_or_create_key(&self, object: &str) -> Result<ObjectHandle> {
        if let Some(k) = self.find_key(object)? {
            return Ok(k);
        }
        let template = [
            Attribute::Class(ObjectClass::SECRET_KEY),
            Attribute::KeyType(KeyType::GENERIC_SECRET),
            Attribute::ValueLen(32u64.into()),
            Attribute::Token(true),
            Attribute::Private(true),
            Attribute::Sensitive(true),
            Attribute::Extractable(false),
            Attribute::Sign(true),
            Attribute::Verify(true),
            Attribute::Encrypt(false),
            Attribute::Decrypt(false),
            Attribute::Wrap(false),
            Attribute::Unwrap(false),
            Attribute::Derive(false),
            Attribute::Label(object.as_bytes().to_vec()),
        ];
        self.session
            .generate_key(&Mechanism::GenericSecretKeyGen, &template)
            .map_err(|e| {
                p11_error(
                    &format!("cannot generate a secret key on token {:?}", self.label),
                    e,
                )
            })
    }

    /// The KEK: HMAC-SHA256 on the token over the domain prefix and `salt`.
    pub fn kek(&self, key: ObjectHandle, salt: &[u8; 32]) -> Result<Kek> {
        let mac = Zeroizing::new(
            self.session
                .sign(&Mechanism::Sha256Hmac, key, &message(salt))
                .map_err(|e| p11_error(&format!("HMAC on token {:?}", self.label), e))?,
        );
        let k: [u8; 32] = mac[..]
            .try_into()
            .map_err(|_| Failure::other("PKCS#11 HMAC-SHA256 did not return 32 bytes"))?;
        Ok(Kek::from_slice(&k))
    }
}

/// Loads the module and finds the slot holding the token labelled `label`.
fn find_token(module: &Path, label: &str) -> Result<(Pkcs11, cryptoki::slot::Slot)> {
    if !module.exists() {
        return Err(Failure::other(format!(
            "PKCS#11 module {} does not exist",
            module.display()
        )));
    }
    let ctx = Pkcs11::new(module).map_err(|e| {
        Failure::other(format!(
            "cannot load PKCS#11 module {}: {e}",
            module.display()
        ))
    })?;
    match ctx.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)) {
        Ok(()) | Err(PError::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {}
        Err(e) => return Err(p11_error(&format!("module {}", module.display()), e)),
    }
    let slots = ctx
        .get_slots_with_token()
        .map_err(|e| p11_error("slot list", e))?;
    let mut present = Vec::new();
    for s in slots {
        if let Ok(info) = ctx.get_token_info(s) {
            let l = info.label().trim_end().to_string();
            if l == label {
                return Ok((ctx, s));
            }
            present.push(format!("{l:?}"));
        }
    }
    Err(Failure::other(format!(
        "no PKCS#11 token labelled {label:?} is present (is it inserted?); tokens found: {}",
        if present.is_empty() {
            "none".to_string()
        } else {
            present.join(", ")
        }
    )))
}

/// Reads the user PIN: first line of `pin_file`, or a prompt without echo.
pub fn read_pin(pin_file: Option<&Path>, token: &str) -> Result<AuthPin> {
    let pin = match pin_file {
        Some(p) => {
            let raw = read_first_line(p, "PIN file")?;
            Zeroizing::new(
                String::from_utf8(raw.to_vec())
                    .map_err(|_| Failure::usage(format!("PIN file {} is not text", p.display())))?,
            )
        }
        None => prompt_secret(
            &format!("PIN for token {token:?}: "),
            "PIN",
            "--pin-file FILE",
        )?,
    };
    Ok(AuthPin::from(pin.as_str()))
}

/// Creates the key on the token (or reuses it) and returns the new slot's fields and KEK.
pub fn new_slot(
    module: &Path,
    token: &str,
    pin_file: Option<&Path>,
    volume_id: &[u8; 16],
    slot_id: u32,
) -> Result<(Fields, Kek)> {
    let pin = read_pin(pin_file, token)?;
    let t = Token::open(module, token, &pin)?;
    let object = object_label(volume_id, slot_id);
    let key = t.find_or_create_key(&object)?;
    let salt: [u8; 32] = cloakfs_core::crypto::random::array();
    let kek = t.kek(key, &salt)?;
    let mut f = Fields::new();
    f.insert("pkcs11_token".into(), token.to_string());
    f.insert("pkcs11_object".into(), object);
    f.insert("salt".into(), b64(&salt));
    Ok((f, kek))
}

/// Opens tokens lazily while slots are tried: the module is loaded and the PIN asked only when
/// a pkcs11 slot comes up, once per token.
pub struct Unlocker<'a> {
    module: PathBuf,
    token_override: Option<&'a str>,
    pin_file: Option<&'a Path>,
    tokens: HashMap<String, Token>,
}

impl<'a> Unlocker<'a> {
    pub fn new(module: &Path, token_override: Option<&'a str>, pin_file: Option<&'a Path>) -> Self {
        Self {
            module: module.to_path_buf(),
            token_override,
            pin_file,
            tokens: HashMap::new(),
        }
    }

    /// The KEK the token gives for `slot`.
    pub fn kek(&mut self, slot: &KeySlot, _volume_id: &[u8; 16]) -> Result<Option<Kek>> {
        let label = match self.token_override {
            Some(l) => l.to_string(),
            None => slot.get("pkcs11_token")?.to_string(),
        };
        if !self.tokens.contains_key(&label) {
            let pin = read_pin(self.pin_file, &label)?;
            let t = Token::open(&self.module, &label, &pin)?;
            self.tokens.insert(label.clone(), t);
        }
        let t = &self.tokens[&label];
        let object = slot.get("pkcs11_object")?;
        let key = t.find_key(object)?.ok_or_else(|| {
            Failure::new(
                code::WRONG_SECRET,
                format!(
                    "PKCS#11 token {label:?} holds no key for slot {} (object {object:?})",
                    slot.id()
                ),
            )
        })?;
        let salt: [u8; 32] = slot.bytes("salt")?;
        Ok(Some(t.kek(key, &salt)?))
    }
}
