//! How a new directory's ID is chosen (docs/FORMAT.md section 9.2): derived from its parent's
//! ID and its plaintext name, so two devices of a sync folder that make the same path write
//! identical `cloakfs.dirid` files and the sync client sees no conflict.
//!
//! `K_dirid = HKDF(MK, salt = volume ID, info = "cloakfs v1 directory id")`;
//! `ID = HMAC-SHA256(K_dirid, parent ID || plaintext name)[..16]`. The parent ID is always 16
//! bytes, so the concatenation is unambiguous. Readers never derive: they read the ID file.

use crate::crypto::keys::{label, MasterKey};
use crate::crypto::prf::Prf;
use crate::format::names::DirId;

/// The key new directory IDs are derived with (in locked memory).
#[derive(Debug)]
pub struct DirIdKey(Prf);

impl DirIdKey {
    /// The key of the volume with master key `mk` and ID `volume_id`.
    pub fn new(mk: &MasterKey, volume_id: &[u8; 16]) -> Self {
        Self(Prf::new(&mk.subkey(volume_id, label::DIR_ID)))
    }

    /// The ID of a new directory named `name` (plaintext) in the directory with ID `parent`.
    pub fn derive(&self, parent: &DirId, name: &[u8]) -> DirId {
        DirId(self.0.out(&[&parent.0, name]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_path_same_id_and_each_input_matters() {
        let k = DirIdKey::new(&MasterKey::from_bytes(&[7; 32]), &[1; 16]);
        let p = DirId([2; 16]);
        assert_eq!(k.derive(&p, b"docs"), k.derive(&p, b"docs"));
        assert_ne!(k.derive(&p, b"docs"), k.derive(&p, b"doc"));
        assert_ne!(k.derive(&p, b"docs"), k.derive(&DirId([3; 16]), b"docs"));
        let other = DirIdKey::new(&MasterKey::from_bytes(&[8; 32]), &[1; 16]);
        assert_ne!(k.derive(&p, b"docs"), other.derive(&p, b"docs"));
        let other_volume = DirIdKey::new(&MasterKey::from_bytes(&[7; 32]), &[9; 16]);
        assert_ne!(k.derive(&p, b"docs"), other_volume.derive(&p, b"docs"));
    }

    /// HMAC-SHA256 under the HKDF output, computed by hand from the definition.
    #[test]
    fn matches_the_definition() {
        use hkdf::Hkdf;
        use hmac::{Hmac, Mac};
        use sha2::Sha256;
        let mk = [7u8; 32];
        let vid = [1u8; 16];
        let mut kd = [0u8; 32];
        Hkdf::<Sha256>::new(Some(&vid), &mk)
            .expand(b"cloakfs v1 directory id", &mut kd)
            .unwrap();
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&kd).unwrap();
        m.update(&[2u8; 16]);
        m.update(b"docs");
        let want = m.finalize().into_bytes();
        let k = DirIdKey::new(&MasterKey::from_bytes(&mk), &vid);
        assert_eq!(k.derive(&DirId([2; 16]), b"docs").0[..], want[..16]);
    }
}
